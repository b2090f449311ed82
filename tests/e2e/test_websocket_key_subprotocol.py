"""Browsers put the key in a websocket subprotocol, never in the URL; `?token=` still works."""

import asyncio
import json

import pytest
import websockets

from tests.e2e.support import api, create_session
from tests.factories import AgentFactory, api_key_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


async def _first_frame(url: str, subprotocols: list[str]) -> tuple[str | None, dict, int | None]:
    async with websockets.connect(url, subprotocols=subprotocols) as ws:
        frame = json.loads(await asyncio.wait_for(ws.recv(), 10))
        if frame["type"] == "error":
            await asyncio.wait_for(ws.wait_closed(), 10)
        return ws.subprotocol, frame, ws.close_code


def test_a_key_offered_as_a_subprotocol_authenticates_and_is_never_echoed(live_stack):
    AgentFactory(slug="echo")
    key = api_key_for("carol")
    with api(live_stack, key) as client:
        session_id = create_session(client, "echo")
        client.post(f"/api/v1/sessions/{session_id}/messages/", json={"content": "hi"})
    url = f"{live_stack.ws}/ws/sessions/{session_id}/?after=0"

    chosen, frame, _ = asyncio.run(_first_frame(url, ["agentplatform.v1", f"bearer.{key}"]))
    assert chosen == "agentplatform.v1"  # the server answers the protocol, not the key
    assert frame["type"] != "error" and frame["session"] == session_id

    _, refused, code = asyncio.run(_first_frame(url, ["agentplatform.v1", "bearer.ap_wrong"]))
    assert refused["type"] == "error" and refused["data"]["code"] == "not_authenticated"
    assert code == 4401

    # Existing clients keep `?token=` (documented; access logs redact it).
    chosen, frame, _ = asyncio.run(_first_frame(f"{url}&token={key}", []))
    assert chosen is None and frame["type"] != "error"
