"""Size limits on the live stack: a 1.2 MB tool result in a turn, then a websocket replay from
the start and the Python client's `run_turn`, both with every event (no 1011); and an event
stored larger than EVENT_MAX_BYTES (before the limit) replayed as a frame pointing to it."""

import asyncio
import json
import uuid

import pytest
from agentplatform_client import Client, ToolFinished
from django.contrib.auth import get_user_model

from record.models import Event, Session, ToolCall
from tests.e2e.support import api, get_events, persisted, recv_frame, stack_logs, ws_connect
from tests.factories import (
    AgentFactory,
    ModelEndpointFactory,
    SessionFactory,
    ToolFactory,
    api_key_for,
)
from tests.stack import Stack
from tests.tools.http_server import Answer, ScriptedApi

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

MB = 1024 * 1024


def _export_agent(url: str) -> str:
    """A rules agent whose `export` HTTP tool answers 1.2 MB of JSON."""
    name = f"export_{uuid.uuid4().hex[:6]}"
    ToolFactory(name=name, kind="http", handler="", url=url, method="GET")
    slug = f"exporter-{uuid.uuid4().hex[:8]}"
    AgentFactory(
        slug=slug,
        model=ModelEndpointFactory(name=f"rules-{slug}", api="rules", options={}),
        tools=[name],
        rules=[
            {"when": {"last_tool": name}, "answer": "Exported."},
            {"when": {"last_tool": None}, "tool_calls": [{"tool": name, "args": {}}]},
        ],
    )
    return slug


async def _replay(stack: Stack, session_id: str, key: str, count: int) -> list[dict]:
    async with ws_connect(stack, session_id, key, after=0, max_size=16 * MB) as ws:
        return [await recv_frame(ws, 15) for _ in range(count)]


def test_a_large_tool_result_replays_whole_over_the_websocket_and_the_client(live_stack: Stack):
    rows = [{"id": i, "text": f"row {i:06d} " + "x" * 100} for i in range(10_000)]
    body_bytes = len(json.dumps({"rows": rows}).encode())
    assert body_bytes > 1.1 * MB
    key = api_key_for("sizes-e2e")
    with ScriptedApi(Answer(200, {"rows": rows})) as business:
        slug = _export_agent(business.url("/export"))
        with Client(live_stack.http, key) as client:
            session = client.create_session(slug)
            first = client.run_turn(session.id, "export everything", timeout=60)
            second = client.run_turn(session.id, "and again", timeout=60)
            history = list(client.iter_events(session.id))
            with client.stream(session.id, after=0) as stream:
                streamed = [stream.receive(timeout=15) for _ in range(len(history))]
                assert stream.reconnects == 0

    for result in (first, second):
        assert result.answer == "Exported.", result.events
        (done,) = [e for e in result.events if isinstance(e, ToolFinished)]
        assert done.status == "success"
        # The tool result was cut to TOOL_RESULT_MAX_BYTES, with its marker and original size.
        assert done.output["result_cut"]["original_bytes"] == body_bytes
        assert done.output["partial_result"].startswith('{"rows": [{"id": 0')
    calls = ToolCall.objects.filter(session_id=session.id)
    assert [c.output["result_cut"]["original_bytes"] for c in calls] == [body_bytes] * 2
    # Replay from the start: every persisted event, in order, as REST lists them.
    assert [(e.seq, e.type, e.data) for e in streamed] == [(e.seq, e.type, e.data) for e in history]
    with api(live_stack, key) as rest:
        events = get_events(rest, session.id)
    frames = asyncio.run(_replay(live_stack, session.id, key, len(events)))
    assert [(f["seq"], f["data"]) for f in persisted(frames)] == [
        (e["seq"], e["data"]) for e in events
    ]
    assert all(len(json.dumps(f).encode()) <= MB for f in frames)


def test_an_event_stored_over_the_limit_is_replayed_as_a_frame_pointing_to_it(live_stack: Stack):
    key = api_key_for("sizes-legacy")
    session = SessionFactory(owner=get_user_model().objects.get(username="sizes-legacy"))
    huge = {"call_id": "c1", "tool": "export", "status": "success", "error": "", "turn": 1,
            "output": {"blob": "x" * 1_200_000}}  # fmt: skip
    Event.objects.create(session=session, seq=1, type="progress", data={"stage": "a", "turn": 1})
    Event.objects.create(session=session, seq=2, type="tool.finished", data=huge)
    Event.objects.create(session=session, seq=3, type="progress", data={"stage": "b", "turn": 1})
    Session.objects.filter(pk=session.pk).update(event_seq=3)

    frames = asyncio.run(_replay(live_stack, str(session.pk), key, 3))

    assert [f["seq"] for f in frames] == [1, 2, 3], stack_logs(live_stack, "web")()
    pointer = frames[1]["data"]
    url = f"/api/v1/sessions/{session.pk}/events/?after=1&limit=1"
    assert pointer == {
        "call_id": "c1", "tool": "export", "status": "success", "error": "", "turn": 1,
        "truncated": {"event_bytes": pointer["truncated"]["event_bytes"]}, "url": url,
    }  # fmt: skip
    assert pointer["truncated"]["event_bytes"] > MB
    # The REST page it points to holds the event whole.
    with api(live_stack, key) as rest:
        whole = rest.get(url).json()
    assert [(e["seq"], e["data"]) for e in whole] == [(2, huge)]
    # The Python client replays it too, without reconnecting.
    with Client(live_stack.http, key) as client, client.stream(str(session.pk), after=0) as stream:
        replayed = [stream.receive(timeout=15) for _ in range(3)]
        assert stream.reconnects == 0
    assert [e.seq for e in replayed] == [1, 2, 3]
    assert replayed[1].url == url
