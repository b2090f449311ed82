"""Messages posted at once into one session become one turn each, in arrival order."""

import asyncio

import pytest

from tests.e2e.support import (
    api,
    assert_seq_strictly_increasing,
    async_api,
    collect_until,
    create_session,
    get_events,
    get_messages,
    stack_logs,
    turns_finished,
    until_turns_finished,
    wait_events,
    ws_connect,
)
from tests.factories import AgentFactory, api_key_for

# Run again with FAST_PATHS=off by make test (tests/lanes.py): the fallbacks on the real stack.
pytestmark = [pytest.mark.e2e, pytest.mark.fast_paths, pytest.mark.django_db(transaction=True)]

N = 10


def test_ten_concurrent_messages_run_as_ten_ordered_turns(live_stack):
    AgentFactory(slug="echo", rules=[{"answer": "Echo: {{ user }}"}])
    key = api_key_for("alice")
    with api(live_stack, key) as client:
        session_id = create_session(client, "echo")
        contents = [f"message number {i}" for i in range(N)]

        async def scenario():
            async with ws_connect(live_stack, session_id, key, after=0) as ws:
                async with async_api(live_stack, key) as aclient:
                    url = f"/api/v1/sessions/{session_id}/messages/"
                    responses = await asyncio.gather(
                        *(aclient.post(url, json={"content": c}) for c in contents)
                    )
                frames = await collect_until(
                    ws, until_turns_finished(N), timeout=60, describe=stack_logs(live_stack)
                )
            return responses, frames

        responses, frames = asyncio.run(scenario())
        for response in responses:
            assert response.status_code == 202, response.text
        events = wait_events(
            client, session_id, turns_finished(N), 30, lambda: live_stack.log_tail("worker")
        )
        messages = get_messages(client, session_id)
        assert get_events(client, session_id) == events  # nothing after the last turn

    # Arrival order: the order in which the service accepted them (message ids).
    accepted = sorted((r.json()["id"], r.json()["content"]) for r in responses)
    arrival = [content for _id, content in accepted]
    assert sorted(arrival) == sorted(contents)

    # History: user, assistant, user, assistant, ... never interleaved.
    summary = [(m["turn"], m["role"], m["content"]) for m in messages]
    assert [m["role"] for m in messages] == ["user", "assistant"] * N, summary
    assert [m["seq"] for m in messages] == list(range(1, 2 * N + 1)), summary
    users = [m for m in messages if m["role"] == "user"]
    assert [m["id"] for m in users] == [i for i, _c in accepted], summary
    for turn, (user, answer) in enumerate(zip(messages[::2], messages[1::2], strict=True), 1):
        assert user["content"] == arrival[turn - 1], summary
        assert answer["content"] == f"Echo: {user['content']}", summary
        assert user["turn"] == answer["turn"] == turn, summary
        assert user["status"] == answer["status"] == "final"

    # Ten turn.finished events, turns 1..10, each an answer; the live stream agrees.
    finished = [e["data"] for e in events if e["type"] == "turn.finished"]
    assert [d["turn"] for d in finished] == list(range(1, N + 1))
    assert {d["stop_reason"] for d in finished} == {"answer"}
    assert_seq_strictly_increasing(frames)
    live = [f for f in frames if f["seq"] is not None]
    assert [(f["seq"], f["type"], f["data"]) for f in live] == [
        (e["seq"], e["type"], e["data"]) for e in events
    ]
    # Within the event stream, turns never overlap: each turn's events are contiguous.
    turn_of = [
        e["data"]["turn"] for e in events if e["type"] in ("message.completed", "turn.finished")
    ]
    assert turn_of == sorted(turn_of), turn_of
