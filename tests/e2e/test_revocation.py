"""Revoking a key reaches its open websockets; the API's own limits on a real stack."""

import asyncio
import contextlib
import json
import time
import uuid

import httpx
import pytest
import websockets
from django.core.management import call_command
from websockets.exceptions import ConnectionClosed

from accounts.models import ApiKey
from accounts.services import api_key_create
from record.models import Message, Session
from tests.e2e.support import api, create_session, expect_silence, ws_connect, ws_url
from tests.factories import AgentFactory, UserFactory, api_key_for
from tests.stack import Stack, running_stack

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


async def _closed_with(ws, timeout: float = 10) -> tuple[list[dict], int | None]:  # type: ignore[no-untyped-def]
    """Frames received until the server closes, and the close code."""
    frames = []
    try:
        async with asyncio.timeout(timeout):
            while True:
                frames.append(json.loads(await ws.recv()))
    except ConnectionClosed as exc:
        return frames, exc.rcvd.code if exc.rcvd else None


def _error_codes(frames: list[dict]) -> list[str]:
    return [f["data"]["code"] for f in frames if f["type"] == "error"]


def test_revoking_a_key_closes_its_open_websockets_and_refuses_their_frames(live_stack):
    AgentFactory(slug="echo", rules=[{"answer": "Echo: {{ user }}"}])
    issued = api_key_create(username="alice", roles=["support"])
    key = issued.raw
    keep = api_key_for("alice")  # another key of the same user stays usable
    with api(live_stack, key) as client:
        first, second = create_session(client, "echo"), create_session(client, "echo")

    async def scenario():  # type: ignore[no-untyped-def]
        async with (
            ws_connect(live_stack, first, key) as ws1,
            ws_connect(live_stack, second, key) as ws2,
            ws_connect(live_stack, first, keep) as other,
        ):
            await expect_silence(ws1, 0.3)  # connected and idle
            await asyncio.to_thread(call_command, "revoke_api_key", issued.api_key.prefix)
            # Sent after the revocation, possibly before its close arrives: never stored.
            # If the close won the race, the send itself fails, which is just as good.
            with contextlib.suppress(ConnectionClosed):
                await ws1.send(json.dumps({"type": "user_message", "content": "too late"}))
            results = [await _closed_with(ws1), await _closed_with(ws2)]
            await expect_silence(other, 0.5)  # still open
            await other.send(json.dumps({"type": "user_message", "content": "still fine"}))
            return results

    results = asyncio.run(scenario())
    for frames, code in results:
        assert code == 4401, (frames, code)
        assert "key_revoked" in _error_codes(frames), frames
    assert not Message.objects.filter(session_id=first, content="too late").exists()
    deadline = time.monotonic() + 10
    while not Message.objects.filter(session_id=first, content="still fine").exists():
        assert time.monotonic() < deadline, "the other key's frame was not stored"
        time.sleep(0.1)
    with api(live_stack, key) as client:
        response = client.get(f"/api/v1/sessions/{first}/")
    assert response.status_code == 401, response.text


def test_a_key_or_session_changed_behind_the_platforms_back_is_seen_on_the_next_frame(
    live_stack,
):
    AgentFactory(slug="echo", rules=[{"answer": "Echo: {{ user }}"}])
    issued = api_key_create(username="alice", roles=["support"])
    moved_key = api_key_for("alice")
    with api(live_stack, issued.raw) as client:
        session_id = create_session(client, "echo")
    with api(live_stack, moved_key) as client:
        moved_id = create_session(client, "echo")

    async def scenario():  # type: ignore[no-untyped-def]
        async with (
            ws_connect(live_stack, session_id, issued.raw) as ws,
            ws_connect(live_stack, moved_id, moved_key) as moved,
        ):
            await expect_silence(ws, 0.3)
            # No service call, so no close message and no revocation mark:
            # only the periodic re-read (WS_AUTH_RECHECK_S, 2 s) can notice.
            await asyncio.to_thread(
                lambda: ApiKey.objects.filter(pk=issued.api_key.pk).update(is_active=False)
            )
            await asyncio.to_thread(
                lambda: Session.objects.filter(pk=moved_id).update(
                    owner=UserFactory(username="mallory")
                )
            )
            await asyncio.sleep(2.5)
            await ws.send(json.dumps({"type": "user_message", "content": "after deactivation"}))
            await moved.send(json.dumps({"type": "user_message", "content": "after the move"}))
            return await _closed_with(ws), await _closed_with(moved)

    (frames, code), (moved_frames, moved_code) = asyncio.run(scenario())
    assert code == 4401 and _error_codes(frames) == ["key_revoked"], (frames, code)
    assert moved_code == 4404 and _error_codes(moved_frames) == ["not_found"], moved_frames
    assert not Message.objects.filter(session_id__in=[session_id, moved_id]).exists()


def test_last_used_at_is_written(live_stack):
    issued = api_key_create(username="alice", roles=["support"])
    with api(live_stack, issued.raw) as client:
        assert client.get("/api/v1/sessions/").status_code == 200
    deadline = time.monotonic() + 10
    while issued.api_key.last_used_at is None:
        assert time.monotonic() < deadline, "last_used_at never written"
        time.sleep(0.1)
        issued.api_key.refresh_from_db()


# Limits: a stack of their own with small limits, behind one trusted proxy so each
# test calls from an address of its own (X-Forwarded-For) and counts don't mix.


@pytest.fixture(scope="module")
def limited_stack(django_db_setup, django_db_blocker):  # type: ignore[no-untyped-def]
    env = {
        "WS_MAX_SOCKETS_PER_KEY": "2",
        "SESSION_CREATE_LIMIT": "2",
        "SESSION_CREATE_WINDOW_S": "30",
        "AUTH_FAIL_LIMIT": "3",
        "AUTH_FAIL_WINDOW_S": "30",
        "TRUSTED_PROXY_COUNT": "1",
        "REDIS_KEY_PREFIX": f"test-limits-{uuid.uuid4().hex}",
    }
    with django_db_blocker.unblock(), running_stack(extra_env=env) as stack:
        yield stack


def _from(address: str) -> dict[str, str]:
    return {"X-Forwarded-For": address}


def _assert_429(response: httpx.Response) -> None:
    assert response.status_code == 429, response.text
    retry_after = int(response.headers["Retry-After"])
    assert retry_after in range(1, 31), retry_after
    error = response.json()["error"]
    assert error["code"] == "rate_limited" and error["details"] == {"retry_after_s": retry_after}


def test_session_creation_rate_per_key(limited_stack: Stack):
    AgentFactory(slug="echo", rules=[{"answer": "hi"}])
    key = api_key_for("alice")
    with api(limited_stack, key) as client:
        for _ in range(2):
            assert client.post("/api/v1/sessions/", json={"agent": "echo"}).status_code == 201
        _assert_429(client.post("/api/v1/sessions/", json={"agent": "echo"}))
    assert Session.objects.count() == 2


def test_open_websockets_per_key(limited_stack: Stack):
    AgentFactory(slug="echo", rules=[{"answer": "hi"}])
    key = api_key_for("alice")
    with api(limited_stack, key) as client:
        session_id = create_session(client, "echo")

    async def scenario():  # type: ignore[no-untyped-def]
        async with ws_connect(limited_stack, session_id, key) as ws1:
            async with ws_connect(limited_stack, session_id, key) as ws2:
                await expect_silence(ws2, 0.2)
                async with ws_connect(limited_stack, session_id, key) as ws3:
                    refused = await _closed_with(ws3)
            # One closed: its slot is free again.
            async with ws_connect(limited_stack, session_id, key) as ws4:
                await expect_silence(ws4, 0.5)
            await expect_silence(ws1, 0.2)
        return refused

    frames, code = asyncio.run(scenario())
    assert code == 4429, (frames, code)
    assert _error_codes(frames) == ["too_many_sockets"]
    assert frames[0]["data"]["details"] == {"limit": 2}


def test_failed_authentication_slows_the_address_down(limited_stack: Stack):
    AgentFactory(slug="echo", rules=[{"answer": "hi"}])
    good = api_key_for("alice")
    with api(limited_stack, good) as client:
        session_id = create_session(client, "echo")
    attacker = _from("198.51.100.7")

    async def scenario():  # type: ignore[no-untyped-def]
        outcomes = []
        for key in ("ap_wrong1", "ap_wrong2", "ap_wrong3", good):
            headers = {"Authorization": f"Bearer {key}", **attacker}
            async with websockets.connect(
                ws_url(limited_stack, session_id), additional_headers=headers, open_timeout=10
            ) as ws:
                outcomes.append(await _closed_with(ws))
        return outcomes

    with httpx.Client(base_url=limited_stack.http, timeout=15) as bare:

        def call(key: str, headers: dict[str, str]) -> httpx.Response:
            return bare.get(
                "/api/v1/sessions/", headers={"Authorization": f"Bearer {key}", **headers}
            )

        # Over the websocket: three wrong keys, then even the right one is refused.
        outcomes = asyncio.run(scenario())
        assert [code for _frames, code in outcomes] == [4401, 4401, 4401, 4429], outcomes
        frames = outcomes[-1][0]
        assert _error_codes(frames) == ["rate_limited"]
        assert frames[0]["data"]["details"]["retry_after_s"] in range(1, 31), frames
        # Over REST as well: the address is slowed down, another is not.
        _assert_429(call(good, attacker))
        assert call(good, _from("198.51.100.8")).status_code == 200
