"""The real daphne's access log never shows an API key from a query string."""

import asyncio
import time

import httpx
import pytest
import websockets

from tests.e2e.support import api, create_session, ws_url
from tests.factories import AgentFactory, api_key_for
from tests.stack import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def _web_log(stack: Stack) -> str:
    return stack.logs["web"].read_text(errors="replace")


def _wait_for_line(stack: Stack, needle: str, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = _web_log(stack)
        if needle in text:
            return text
        time.sleep(0.1)
    raise AssertionError(f"{needle!r} not in the web log:\n{stack.log_tail('web')}")


def test_keys_in_query_strings_are_redacted_from_the_access_log(live_stack: Stack):
    AgentFactory(slug="echo", rules=[{"answer": "Echo: {{ user }}"}])
    key = api_key_for("alice")
    with api(live_stack, key) as client:
        session_id = create_session(client, "echo")
    bogus = "SECRET-not-a-key-4f1c"

    # HTTP: a real key and a bogus one in ?token= and ?key=.
    for url in (
        f"/api/v1/sessions/?token={key}",
        f"/api/v1/sessions/{session_id}/?limit=3&token={bogus}",
        f"/playground/?key={key}",
    ):
        httpx.get(f"{live_stack.http}{url}", timeout=10)

    # Websocket: the real key as ?token=, and a bogus one (closed 4401 after the handshake).
    async def scenario() -> int | None:
        async with websockets.connect(ws_url(live_stack, session_id, after=0, token=key)):
            pass
        async with websockets.connect(ws_url(live_stack, session_id, token=bogus)) as ws:
            with pytest.raises(websockets.exceptions.ConnectionClosed):
                while True:
                    await ws.recv()
            return ws.close_code

    assert asyncio.run(asyncio.wait_for(scenario(), 20)) == 4401

    text = _wait_for_line(live_stack, "WSDISCONNECT")
    text = _wait_for_line(live_stack, "/playground/?key=[redacted]")
    assert key not in text and bogus not in text
    assert f"/api/v1/sessions/{session_id}/?limit=3&token=[redacted]" in text
    assert "/api/v1/sessions/?token=[redacted]" in text
    assert f"/ws/sessions/{session_id}/" in text
