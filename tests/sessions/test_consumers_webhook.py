"""A websocket `user_message` takes a `webhook` as the REST message does: one the egress
policy refuses is an error frame naming it, with nothing stored; an allowed one is kept
for the message's turn."""

import pytest
from asgiref.sync import sync_to_async

from hooks.models import RunWebhook
from record.models import Message
from tests.sessions.test_consumers_key_roles import (
    _alice_keys_and_admin_session,
    _connect,
    _next_of,
)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _no_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("record.dispatch.run_enqueue_on_commit", lambda *args: None)


async def test_a_frames_webhook_obeys_the_egress_policy(settings):
    admin, _support, session = await sync_to_async(_alice_keys_and_admin_session)()
    ws = await _connect(session, admin)
    try:
        settings.EGRESS_ALLOW = []
        await ws.send_json_to(
            {"type": "user_message", "content": "hi", "webhook": {"url": "http://127.0.0.1:9/h"}}
        )
        error = await _next_of(ws, "error")
        assert error["data"]["details"] == {"field": "webhook.url"}, error
        assert "loopback" in error["data"]["message"]
        assert not await sync_to_async(Message.objects.filter(session=session).exists)()

        settings.EGRESS_ALLOW = ["127.0.0.1"]
        await ws.send_json_to(
            {"type": "user_message", "content": "hi", "webhook": {"url": "http://127.0.0.1:9/h"}}
        )
        await _next_of(ws, "state.changed")
        urls = await sync_to_async(
            lambda: list(RunWebhook.objects.values_list("url", "message__content"))
        )()
        assert urls == [("http://127.0.0.1:9/h", "hi")]
    finally:
        await ws.disconnect()
