"""The session websocket's `user_message` obeys the REST rule: a key without the session's role
gets an error frame `role_not_held`, nothing is stored, and the socket stays open.

In-process (Channels' WebsocketCommunicator) against the real channel layer and PostgreSQL."""

from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth import get_user_model

from accounts.models import ApiKey
from accounts.services import api_key_create
from record.models import Message, Session
from tests.factories import AgentFactory, SessionFactory, ToolFactory
from tests.sessions.test_consumers import _open

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _no_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """A posted turn must not wake a worker of a live stack: the test only looks at the rows."""
    monkeypatch.setattr("record.dispatch.run_enqueue_on_commit", lambda *args: None)


def _alice_keys_and_admin_session() -> tuple[str, str, Session]:
    admin = api_key_create(username="alice", roles=["admin", "support"]).raw
    support = api_key_create(username="alice", roles=["support"]).raw
    ToolFactory(name="wipe_orders", roles=["admin"])
    session: Session = SessionFactory(  # type: ignore[assignment]
        agent=AgentFactory(slug="helper", tools=["wipe_orders"]),
        owner=get_user_model().objects.get(username="alice"),
        role="admin",
    )
    return admin, support, session


async def _connect(session: Session, key: str) -> WebsocketCommunicator:
    [ws] = await _open(session, key, 1)
    return ws


async def _next_of(ws: WebsocketCommunicator, kind: str) -> dict[str, Any]:
    for _ in range(50):
        frame: dict[str, Any] = await ws.receive_json_from(timeout=10)
        if frame["type"] == kind:
            return frame
    raise AssertionError(f"no {kind} frame")


def _messages(session: Session) -> int:
    return Message.objects.filter(session=session).count()


async def test_a_key_without_the_sessions_role_gets_an_error_frame_and_nothing_is_stored():
    admin, support, session = await sync_to_async(_alice_keys_and_admin_session)()
    ws = await _connect(session, support)
    try:
        await ws.send_json_to({"type": "user_message", "content": "wipe all orders"})
        error = await _next_of(ws, "error")
        assert error["seq"] is None
        assert error["data"]["code"] == "role_not_held", error
        assert error["data"]["details"] == {"role": "admin", "key_roles": ["support"]}
        assert await sync_to_async(_messages)(session) == 0
        state = await sync_to_async(lambda: Session.objects.get(pk=session.pk).state)()
        assert state == "idle"

        # The socket stays open: once the key holds the role, the same socket posts.
        await sync_to_async(
            ApiKey.objects.filter(owner__username="alice", roles=["support"]).update
        )(roles=["support", "admin"])
        await ws.send_json_to({"type": "user_message", "content": "now I may"})
        await _next_of(ws, "state.changed")
        assert await sync_to_async(_messages)(session) == 1
    finally:
        await ws.disconnect()


async def test_the_key_holding_the_role_posts_over_the_websocket():
    admin, _support, session = await sync_to_async(_alice_keys_and_admin_session)()
    ws = await _connect(session, admin)
    try:
        await ws.send_json_to({"type": "user_message", "content": "hello"})
        changed = await _next_of(ws, "state.changed")
        assert changed["data"]["to"] == "processing"
        assert await sync_to_async(_messages)(session) == 1
    finally:
        await ws.disconnect()
