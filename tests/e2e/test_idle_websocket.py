"""An idle websocket stays open (no client pings, no traffic) and still gets the next turn.

The test stack's daphne pings every 2 s (tests/stack.py), so 12 s of silence span six
keepalive rounds and more than twice the 5 s after which channels-redis with redis-py 8
used to drop an idle socket's channel (DESIGN.md, performance rules).
"""

import asyncio
import time

import pytest
from websockets.protocol import State

from tests.e2e.support import (
    api,
    collect_until,
    create_session,
    expect_silence,
    post_message,
    ws_connect,
)
from tests.factories import AgentFactory, api_key_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

IDLE_S = 12


def test_idle_websocket_survives_twelve_seconds_of_silence(live_stack):
    AgentFactory(slug="echo", rules=[{"answer": "Echo: {{ user }}"}])
    key = api_key_for("alice")
    with api(live_stack, key) as client:
        session_id = create_session(client, "echo")

        async def scenario():
            # ping_interval=None: the client sends nothing; it only answers the
            # server's keepalive pings, as a browser does.
            async with ws_connect(live_stack, session_id, key, after=0, ping_interval=None) as ws:
                started = time.monotonic()
                await expect_silence(ws, IDLE_S)
                idle = time.monotonic() - started
                assert ws.state is State.OPEN, (ws.state, ws.close_code, ws.close_reason)
                await asyncio.to_thread(post_message, client, session_id, "still there?")
                frames = await collect_until(
                    ws, lambda f, _: f["type"] == "turn.finished", timeout=20
                )
            return idle, frames

        idle, frames = asyncio.run(scenario())
    assert idle >= IDLE_S
    completed = [f["data"]["content"] for f in frames if f["type"] == "message.completed"]
    assert completed == ["still there?", "Echo: still there?"], frames
    assert frames[-1]["data"]["stop_reason"] == "answer"
