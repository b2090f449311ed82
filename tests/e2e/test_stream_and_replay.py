"""The websocket stream of a demo turn, its persisted history, and replay on reconnect."""

import asyncio
import time
from datetime import UTC, datetime

import pytest

from tests.demo_setup import DEMO_REQUEST, demo_install
from tests.e2e.support import (
    api,
    assert_seq_strictly_increasing,
    async_api,
    collect_until,
    comparable,
    create_session,
    expect_silence,
    get_events,
    get_messages,
    persisted,
    post_message,
    recv_frame,
    set_model_options,
    stack_logs,
    turns_finished,
    wait_events,
    ws_connect,
)
from tests.factories import api_key_for

# Run again with FAST_PATHS=off by make test (tests/lanes.py): the fallbacks on the real stack.
pytestmark = [pytest.mark.e2e, pytest.mark.fast_paths, pytest.mark.django_db(transaction=True)]


def _is_turn_finished(frame, _frames):
    return frame["type"] == "turn.finished"


def test_demo_turn_stream_matches_persisted_history(live_stack):
    demo_install()
    key = api_key_for("alice")
    with api(live_stack, key) as client:
        session_id = create_session(client, "order-support")

        async def scenario():
            async with ws_connect(live_stack, session_id, key, after=0) as ws:
                async with async_api(live_stack, key) as aclient:
                    posted = await aclient.post(
                        f"/api/v1/sessions/{session_id}/messages/", json={"content": DEMO_REQUEST}
                    )
                    assert posted.status_code == 202, posted.text
                frames = await collect_until(
                    ws, _is_turn_finished, timeout=30, describe=stack_logs(live_stack)
                )
                # The turn is over: nothing else is sent.
                await expect_silence(ws, 0.5)
                return frames

        frames = asyncio.run(scenario())
        history = get_events(client, session_id, after=0)
        messages = get_messages(client, session_id)
    debug = "\n".join(f"{f['seq']} {f['type']} {f['data']}" for f in frames)

    assert all(f["session"] == session_id for f in frames)
    # Order of the turn: it opens with state.changed idle -> processing, then the
    # user's message entering the history, ...
    stream = persisted(frames)
    first_state = stream[0]
    assert first_state["type"] == "state.changed", debug
    assert first_state["data"]["from"] == "idle" and first_state["data"]["to"] == "processing"
    assert first_state["data"]["trigger"] == "user_message"
    assert stream[1]["type"] == "message.completed", debug
    assert stream[1]["data"]["role"] == "user" and stream[1]["data"]["content"] == DEMO_REQUEST
    # ... and turn.finished is the very last frame.
    assert frames[-1]["type"] == "turn.finished", debug
    assert frames[-1]["data"]["stop_reason"] == "answer", debug
    assert sum(f["type"] == "turn.finished" for f in frames) == 1

    # seq: present on every persisted frame, strictly increasing, no gap (a new session).
    assert_seq_strictly_increasing(frames)
    assert [f["seq"] for f in stream] == list(range(1, len(stream) + 1)), debug
    ephemeral = [f for f in frames if f["seq"] is None]
    assert {f["type"] for f in ephemeral} <= {"message.delta", "progress"}, debug

    # The state machine's moves chain up, from idle to finished.
    moves = [(f["data"]["from"], f["data"]["to"]) for f in frames if f["type"] == "state.changed"]
    assert all(a[1] == b[0] for a, b in zip(moves, moves[1:], strict=False)), moves
    assert moves[-1][1] == "finished", moves

    # Text deltas come before the final answer and add up to it.
    final_index = max(
        i
        for i, f in enumerate(frames)
        if f["type"] == "message.completed" and f["data"]["role"] == "assistant"
    )
    final = frames[final_index]
    deltas = [i for i, f in enumerate(frames) if f["type"] == "message.delta"]
    assert deltas, debug
    assert max(deltas) < final_index, debug
    assert "".join(frames[i]["data"]["text"] for i in deltas) == final["data"]["content"], debug
    assert final["data"]["content"].startswith("Done. I found 3 orders"), final

    # What was streamed is exactly what was persisted (seq, type, session, time, data).
    assert [comparable(e) for e in history] == [comparable(f) for f in stream]

    # The message history equals the message.completed frames, in order.
    completed = [f["data"] for f in stream if f["type"] == "message.completed"]
    assert [(m["seq"], m["role"], m["content"]) for m in messages] == [
        (d["seq"], d["role"], d["content"]) for d in completed
    ]
    assert [m["status"] for m in messages] == ["final"] * len(messages)
    # One model call per assistant message: the turn summary counts them all.
    assistant_messages = [m for m in messages if m["role"] == "assistant"]
    assert frames[-1]["data"]["iterations"] == len(assistant_messages) == 4, frames[-1]
    tool_messages = [m for m in messages if m["role"] == "tool"]
    assert [m["name"] for m in tool_messages] == [
        "query_orders",
        "send_notification",
        "send_notification",
        "send_notification",
        "generate_report",
    ]


def test_reconnect_after_a_finished_turn_replays_exactly_the_missing_events(live_stack):
    demo_install()
    key = api_key_for("alice")
    with api(live_stack, key) as client:
        session_id = create_session(client, "order-support")
        post_message(client, session_id, DEMO_REQUEST)
        history = wait_events(
            client,
            session_id,
            turns_finished(1),
            timeout=30,
            describe=lambda: live_stack.log_tail("worker"),
        )
    last = history[-1]["seq"]
    assert [e["seq"] for e in history] == list(range(1, last + 1))
    # (An `after` past the last event is refused with 4400: test_websocket_protocol.py.)
    afters = [0, 1, last // 2, last - 1, last]

    async def replay(after):
        async with ws_connect(live_stack, session_id, key, after=after) as ws:
            expected = [e for e in history if e["seq"] > after]
            frames = [await recv_frame(ws, timeout=10) for _ in expected]
            # Then nothing more: no duplicate, no live frame of a finished turn.
            await expect_silence(ws, 1.0)
            return frames

    async def scenario():
        return await asyncio.gather(*(replay(after) for after in afters))

    results = asyncio.run(scenario())
    for after, frames in zip(afters, results, strict=True):
        expected = [comparable(e) for e in history if e["seq"] > after]
        assert [comparable(f) for f in frames] == expected, f"after={after}"


def test_connecting_mid_turn_gives_no_gap_and_no_duplicate(live_stack):
    """Clients join a slow turn at staggered moments; each sees every event once, in order."""
    demo_install()
    set_model_options("rules", latency_s=0.3, chunk_delay_s=0.05)
    key = api_key_for("alice")
    with api(live_stack, key) as client:
        session_id = create_session(client, "order-support")

        async def watcher(delay):
            await asyncio.sleep(delay)
            joined = datetime.now(UTC)
            async with ws_connect(live_stack, session_id, key, after=0) as ws:
                frames = await collect_until(
                    ws, _is_turn_finished, timeout=40, describe=stack_logs(live_stack)
                )
                await expect_silence(ws, 0.5)
            return joined, frames

        async def scenario():
            watchers = [asyncio.create_task(watcher(0.2 + 0.4 * i)) for i in range(6)]
            async with async_api(live_stack, key) as aclient:
                posted = await aclient.post(
                    f"/api/v1/sessions/{session_id}/messages/", json={"content": DEMO_REQUEST}
                )
                assert posted.status_code == 202, posted.text
            return await asyncio.gather(*watchers)

        started = time.monotonic()
        results = asyncio.run(scenario())
        elapsed = time.monotonic() - started
        history = get_events(client, session_id, after=0)

    assert history[-1]["type"] == "turn.finished"
    expected = [comparable(e) for e in history]
    mid_turn = 0
    for index, (joined, frames) in enumerate(results):
        stream = persisted(frames)
        seqs = [f["seq"] for f in stream]
        assert seqs == list(range(1, len(history) + 1)), f"watcher {index}: {seqs}"
        assert [comparable(f) for f in stream] == expected, f"watcher {index}"
        # Did this client really join while the turn ran (replay, then live frames)?
        times = [datetime.fromisoformat(f["ts"]) for f in stream]
        if times[0] < joined < times[-1]:
            mid_turn += 1
    assert mid_turn >= 3, f"only {mid_turn} watchers joined mid-turn (turn took {elapsed:.1f} s)"
