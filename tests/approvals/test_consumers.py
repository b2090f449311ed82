"""The approvers' websocket: rights read again before every frame, Origin, sockets per key.

In-process (Channels' WebsocketCommunicator) against the real channel layer and
PostgreSQL; frames are published to the approvers' group as notify.py does.
"""

import json
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.contrib.auth import get_user_model
from django.utils import timezone

from accounts.models import ApiKey, Approver
from accounts.services import api_key_create, approver_grant
from agentplatform.asgi import application
from approvals.models import Approval
from approvals.notify import APPROVERS_GROUP, make_frame
from tests.factories import SessionFactory, UserFactory

pytestmark = pytest.mark.django_db(transaction=True)


def _approval(group: str = "approvers") -> Approval:
    approval: Approval = Approval.objects.create(
        session=SessionFactory(owner=UserFactory(username="customer")),
        tool_name="refund",
        arguments={"order": "A1", "amount": 80},
        group=group,
        deadline=timezone.now() + timedelta(minutes=10),
    )
    return approval


def _approver(groups: list[str] | None = None) -> tuple[int, str]:
    """(key id, raw key) of alice, an approver; one approval already waits for her group."""
    issued = api_key_create(username="alice", roles=[])
    approver_grant(username="alice", groups=groups)
    _approval()
    return issued.api_key.pk, issued.raw


def _socket(key: str, headers: list[tuple[bytes, bytes]] | None = None) -> WebsocketCommunicator:
    return WebsocketCommunicator(
        application,
        "/ws/approvals/",
        headers=[(b"authorization", f"Bearer {key}".encode()), *(headers or [])],
    )


async def _open(key: str, headers: list[tuple[bytes, bytes]] | None = None) -> Any:
    """A connected socket that has joined the approvers' group (its first frame, the
    pending approval, is sent after the join)."""
    ws = _socket(key, headers)
    connected, _ = await ws.connect(timeout=10)
    assert connected
    first = json.loads(await ws.receive_from(timeout=10))
    assert first["type"] == "approval.requested"
    return ws


async def _publish(group: str = "approvers") -> Approval:
    approval = await sync_to_async(_approval)(group)
    frame = make_frame("approval.requested", approval)
    await get_channel_layer().group_send(
        APPROVERS_GROUP, {"type": "approval.frame", "frame": frame}
    )
    return approval


def _revoke_approver() -> None:
    Approver.objects.filter(user__username="alice").update(is_active=False)


def _deactivate_user() -> None:
    get_user_model().objects.filter(username="alice").update(is_active=False)


def _deactivate_key() -> None:
    # Straight in the database: no revocation mark, no message to the key's sockets.
    ApiKey.objects.filter(owner__username="alice").update(is_active=False)


@pytest.mark.parametrize(
    ("lose_rights", "code", "close_code"),
    [
        (_revoke_approver, "approver_revoked", 4403),
        (_deactivate_user, "key_revoked", 4401),
        (_deactivate_key, "key_revoked", 4401),
    ],
)
async def test_a_receiver_who_lost_their_rights_gets_no_new_approval_and_is_closed(
    lose_rights, code, close_code
):
    _, key = await sync_to_async(_approver)()
    ws = await _open(key)
    try:
        await sync_to_async(lose_rights)()
        await _publish()
        error = json.loads(await ws.receive_from(timeout=10))
        assert error["type"] == "error" and error["data"]["code"] == code
        closed = await ws.receive_output(timeout=10)
        assert closed == {"type": "websocket.close", "code": close_code}
    finally:
        await ws.disconnect()


async def test_an_approver_taken_out_of_a_group_no_longer_sees_its_approvals():
    _, key = await sync_to_async(_approver)(["approvers", "managers"])
    ws = await _open(key)
    try:
        await sync_to_async(
            lambda: Approver.objects.filter(user__username="alice").update(groups=["approvers"])
        )()
        hidden = await _publish("managers")
        shown = await _publish("approvers")
        frame = json.loads(await ws.receive_from(timeout=10))
        assert frame["data"]["id"] == str(shown.pk) != str(hidden.pk)
        assert await ws.receive_nothing(timeout=0.3)  # and the socket stays open
    finally:
        await ws.disconnect()


async def test_a_browser_on_a_foreign_origin_is_refused_before_the_handshake(settings):
    settings.WS_ALLOWED_ORIGINS = ["https://agents.example.com"]
    _, key = await sync_to_async(_approver)()
    foreign = _socket(key, [(b"origin", b"https://evil.example"), (b"host", b"127.0.0.1:8000")])
    connected, _ = await foreign.connect(timeout=10)
    assert not connected
    await foreign.disconnect()
    # An allowed origin and the page's own (same host) connect (no Origin: the other tests).
    own = (b"host", b"127.0.0.1:8000")
    for origin in (b"https://agents.example.com", b"http://127.0.0.1:8000"):
        ws = await _open(key, [(b"origin", origin), own])
        await ws.disconnect()


async def test_a_key_holds_at_most_the_configured_number_of_approvals_sockets(settings):
    settings.APPROVAL_WS_MAX_SOCKETS_PER_KEY = 2
    settings.WS_MAX_SOCKETS_PER_KEY = 1  # the sessions' limit is counted apart
    _, key = await sync_to_async(_approver)()
    first, second = await _open(key), await _open(key)
    try:
        third = _socket(key)
        connected, _ = await third.connect(timeout=10)
        assert connected  # accepted, then told why and closed
        error = json.loads(await third.receive_from(timeout=10))
        assert error["data"]["code"] == "too_many_sockets"
        assert error["data"]["details"] == {"limit": 2}
        assert await third.receive_output(timeout=10) == {"type": "websocket.close", "code": 4429}
        await third.disconnect()
        await first.disconnect()
        again = await _open(key)  # a closed socket gives its slot back
        await again.disconnect()
    finally:
        await second.disconnect()


# --- The admin's queue page: the same socket, signed in instead of a key ------------------


def _signed_in(username: str, **fields: Any) -> tuple[Any, str]:
    """(user, session cookie) of a signed-in admin user."""
    from django.test import Client

    user = get_user_model().objects.create_user(username, password="pw-not-used", **fields)
    client = Client()
    client.force_login(user)
    return user, client.cookies["sessionid"].value


async def _page_socket(cookie: str) -> WebsocketCommunicator:
    ws = WebsocketCommunicator(
        application,
        "/ws/approvals/",
        headers=[
            (b"cookie", f"sessionid={cookie}".encode()),
            (b"origin", b"http://127.0.0.1:8000"),
            (b"host", b"127.0.0.1:8000"),
        ],
    )
    connected, _ = await ws.connect(timeout=10)
    assert connected
    return ws


async def test_the_queue_page_listens_signed_in_and_sees_its_groups_only():
    _, cookie = await sync_to_async(_signed_in)("bob", is_staff=True)
    await sync_to_async(approver_grant)(username="bob", groups=["managers"])
    await sync_to_async(_approval)("approvers")
    mine = await sync_to_async(_approval)("managers")
    ws = await _page_socket(cookie)
    try:
        first = json.loads(await ws.receive_from(timeout=10))
        assert first["type"] == "approval.requested" and first["data"]["id"] == str(mine.pk)
        assert await ws.receive_nothing(timeout=0.3)
        await _publish("approvers")
        shown = await _publish("managers")
        frame = json.loads(await ws.receive_from(timeout=10))
        assert frame["data"]["id"] == str(shown.pk)
    finally:
        await ws.disconnect()


async def test_a_superuser_sees_every_group_and_a_signed_out_page_is_closed():
    from django.contrib.sessions.models import Session as DjangoSession

    _, cookie = await sync_to_async(_signed_in)("root", is_staff=True, is_superuser=True)
    await sync_to_async(_approval)("managers")
    ws = await _page_socket(cookie)
    try:
        assert json.loads(await ws.receive_from(timeout=10))["data"]["group"] == "managers"
        await _publish("anyone")
        assert json.loads(await ws.receive_from(timeout=10))["data"]["group"] == "anyone"
        await sync_to_async(lambda: DjangoSession.objects.filter(session_key=cookie).delete())()
        await _publish("anyone")
        error = json.loads(await ws.receive_from(timeout=10))
        assert error["data"]["code"] == "signed_out"
        assert await ws.receive_output(timeout=10) == {"type": "websocket.close", "code": 4401}
    finally:
        await ws.disconnect()


@pytest.mark.parametrize("fields", [{"is_staff": True}, {"is_staff": False}])
async def test_a_signed_in_user_who_may_not_see_the_queue_is_refused(fields):
    _, cookie = await sync_to_async(_signed_in)("carol", **fields)
    if not fields["is_staff"]:
        await sync_to_async(approver_grant)(username="carol")  # an approver, not on staff
    await sync_to_async(_approval)()
    ws = await _page_socket(cookie)
    try:
        error = json.loads(await ws.receive_from(timeout=10))
        assert error["data"]["code"] == "permission_denied"
        assert await ws.receive_output(timeout=10) == {"type": "websocket.close", "code": 4403}
    finally:
        await ws.disconnect()


async def test_a_page_whose_approver_rights_go_is_closed():
    _, cookie = await sync_to_async(_signed_in)("dave", is_staff=True)
    await sync_to_async(approver_grant)(username="dave")
    await sync_to_async(_approval)()
    ws = await _page_socket(cookie)
    try:
        # The pending approval comes once the socket has joined the approvers' group.
        assert json.loads(await ws.receive_from(timeout=10))["type"] == "approval.requested"
        await sync_to_async(
            lambda: Approver.objects.filter(user__username="dave").update(is_active=False)
        )()
        await _publish()
        error = json.loads(await ws.receive_from(timeout=10))
        assert error["data"]["code"] == "approver_revoked"
    finally:
        await ws.disconnect()
