"""Durable execution through the real stack (daphne + worker + beat): concurrent and repeated
messages, interrupts, double texting, fork, durable timers across restarts, resumable streams."""

import asyncio
import json
import random
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from record.models import (
    Agent,
    Checkpoint,
    Message,
    ModelCall,
    Session,
    ToolCall,
    Transition,
)
from tests.demo_setup import demo_install
from tests.e2e.support import (
    Frame,
    api,
    async_api,
    collect_until,
    create_session,
    expect_silence,
    get_events,
    get_messages,
    get_session,
    persisted,
    post_message,
    turns_finished,
    until_turns_finished,
    wait_events,
    ws_connect,
)
from tests.factories import AgentFactory, ModelEndpointFactory, ToolFactory, api_key_for
from tests.stack import Stack
from tests.tools.http_server import Answer, ScriptedApi

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

ECHO = [{"answer": "Echo: {{ user }}"}]


def _agent(slug: str, *, options: dict[str, Any] | None = None, **fields: Any) -> Agent:
    endpoint = ModelEndpointFactory(name=f"rules-{slug}", api="rules", options=options or {})
    fields.setdefault("rules", ECHO)
    agent: Agent = AgentFactory.create(slug=slug, model=endpoint, **fields)
    return agent


def _wait_state(
    client: httpx.Client,
    session_id: str,
    states: set[str],
    timeout: float,
    describe: Callable[[], str] = lambda: "",
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        session = get_session(client, session_id)
        if session["state"] in states:
            return session
        if time.monotonic() > deadline:
            raise AssertionError(
                f"state {session['state']} after {timeout} s, wanted {states}\n{describe()}"
            )
        time.sleep(0.05)


def _wait_leased(session_id: str, timeout: float = 10) -> None:
    """A worker holds the session (its model call is under way)."""
    deadline = time.monotonic() + timeout
    while not Session.objects.filter(
        pk=session_id, state="processing", lease_owner__isnull=False
    ).exists():
        assert time.monotonic() < deadline, Session.objects.values("state", "lease_owner").get(
            pk=session_id
        )
        time.sleep(0.02)


def _gapless(events: list[Frame]) -> None:
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1)), [
        (e["seq"], e["type"]) for e in events
    ]


# Concurrent and repeated messages ------------------------------------------------------------------


def test_twenty_clients_at_once_with_repeated_keys_make_exactly_one_turn_per_key_in_order(
    live_stack: Stack,
):
    _agent("echo-many")
    key = api_key_for("alice")
    contents = {f"key-{i:02d}": f"message {i}" for i in range(20)}
    sends = [
        (k, c) for i, (k, c) in enumerate(contents.items()) for _ in range(2 + i % 2)
    ]  # 2-3 times each
    random.Random(7).shuffle(sends)
    with api(live_stack, key) as client:
        session_id = create_session(client, "echo-many")
        url = f"/api/v1/sessions/{session_id}/messages/"

        async def burst() -> list[httpx.Response]:
            async with async_api(live_stack, key) as aclient:
                return list(
                    await asyncio.gather(
                        *(
                            aclient.post(url, json={"content": c, "idempotency_key": k})
                            for k, c in sends
                        )
                    )
                )

        responses = asyncio.run(burst())
        events = wait_events(
            client, session_id, turns_finished(20), 60, lambda: live_stack.log_tail("worker")
        )
        messages = get_messages(client, session_id)
        # A repeat with another body is refused; the same body still answers the first message.
        conflict = client.post(url, json={"content": "something else", "idempotency_key": "key-03"})
        again = client.post(url, json={"content": "message 3", "idempotency_key": "key-03"})

    by_key: dict[str, list[httpx.Response]] = {}
    for (k, _c), response in zip(sends, responses, strict=True):
        by_key.setdefault(k, []).append(response)
    for k, answers in by_key.items():
        assert sorted(r.status_code for r in answers) == [200] * (len(answers) - 1) + [202], (
            k,
            [r.text for r in answers],
        )
        assert len({r.json()["id"] for r in answers}) == 1, k  # every repeat got the first message
    assert (
        conflict.status_code == 409 and conflict.json()["error"]["code"] == "idempotency_key_reused"
    ), conflict.text
    assert again.status_code == 200 and again.json()["id"] == by_key["key-03"][0].json()["id"]

    accepted = sorted((answers[0].json()["id"], k) for k, answers in by_key.items())
    users = [m for m in messages if m["role"] == "user"]
    assert [(m["id"], m["idempotency_key"]) for m in users] == accepted  # arrival order, one each
    assert [m["role"] for m in messages] == ["user", "assistant"] * 20
    assert [m["seq"] for m in messages] == list(range(1, 41))
    for turn, (user, answer) in enumerate(zip(messages[::2], messages[1::2], strict=True), 1):
        assert user["turn"] == answer["turn"] == turn
        assert answer["content"] == f"Echo: {user['content']}"
    _gapless(events)
    finished = [e["data"] for e in events if e["type"] == "turn.finished"]
    assert [(d["turn"], d["stop_reason"]) for d in finished] == [
        (t, "answer") for t in range(1, 21)
    ]
    turn_of = [
        e["data"]["turn"] for e in events if e["type"] in ("message.completed", "turn.finished")
    ]
    assert turn_of == sorted(turn_of)  # turns never interleave


# Interrupts -------------------------------------------------------------------------------------------


def test_cancel_during_a_slow_tool_records_its_result_and_runs_no_further_step(live_stack: Stack):
    with ScriptedApi(default=Answer(200, {"ok": True, "status": "looked up"}, delay_s=2.0)) as slow:
        ToolFactory(
            name="slow_lookup", kind="http", url=slow.url("/lookup"), method="POST", timeout_s=10
        )
        _agent(
            "slow-tool",
            tools=["slow_lookup"],
            rules=[
                {"when": {"last_tool": None}, "tool_calls": [{"tool": "slow_lookup"}]},
                {"answer": "the lookup said {{ result.status }}"},
            ],
        )
        key = api_key_for("alice")
        with api(live_stack, key) as client:
            session_id = create_session(client, "slow-tool")
            post_message(client, session_id, "look it up")
            wait_events(
                client, session_id, lambda ev: any(e["type"] == "tool.started" for e in ev), 15
            )
            time.sleep(0.3)  # the request is at the slow API now
            cancelled = client.post(f"/api/v1/sessions/{session_id}/cancel/")
            events = wait_events(
                client, session_id, turns_finished(1), 20, lambda: live_stack.log_tail("worker")
            )
            messages = get_messages(client, session_id)
        assert len(slow.requests) == 1

    assert cancelled.status_code == 200 and cancelled.json()["cancelled"] is True, cancelled.text
    _gapless(events)
    kinds = [e["type"] for e in events]
    assert kinds.index("tool.finished") < kinds.index("turn.finished")
    (tool_done,) = [e["data"] for e in events if e["type"] == "tool.finished"]
    assert tool_done["status"] == "success" and tool_done["output"]["status"] == "looked up"
    last = events[-1]
    assert last["type"] == "turn.finished", last
    assert (last["data"]["stop_reason"], last["data"]["reason"]) == (
        "cancelled",
        "cancelled by the client",
    )
    # The running tool finished and its result is in the history; no model step came after it.
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"]
    call = ToolCall.objects.get(session_id=session_id)
    assert call.status == "success" and (call.elapsed_ms or 0) >= 1900
    assert ModelCall.objects.filter(session_id=session_id).count() == 1
    move = Transition.objects.filter(session_id=session_id).latest("id")
    assert (move.from_state, move.trigger, move.to_state, move.actor) == (
        "tool_loop",
        "cancel",
        "cancelled",
        "api:alice",
    )
    assert Session.objects.get(pk=session_id).state == "cancelled"


def test_an_interrupt_closes_a_streaming_answer_at_once(live_stack: Stack):
    _agent("long-stream", options={"chunk_delay_s": 0.2})
    words = " ".join(f"w{i}" for i in range(40))  # about 8 s of streaming
    key = api_key_for("alice")
    with api(live_stack, key) as client:
        session_id = create_session(client, "long-stream")

        async def scenario() -> tuple[list[Frame], float]:
            async with ws_connect(live_stack, session_id, key) as ws:
                await ws.send(json.dumps({"type": "user_message", "content": words}))
                frames = await collect_until(
                    ws, lambda f, _: f["type"] == "message.delta", timeout=15
                )
                sent = time.monotonic()
                await ws.send(json.dumps({"type": "interrupt"}))
                frames += await collect_until(ws, until_turns_finished(1), timeout=20)
                took = time.monotonic() - sent
                await expect_silence(ws, 1.0)  # the stream is closed: no more text
                return frames, took

        frames, took = asyncio.run(scenario())
        messages = get_messages(client, session_id)
    last = frames[-1]
    assert last["type"] == "turn.finished" and last["data"]["stop_reason"] == "cancelled", frames
    assert took < 2.0, took  # closed, not streamed to its end (about 8 s)
    assert [m["role"] for m in messages] == ["user"]  # the unfinished answer is not history
    assert list(
        ModelCall.objects.filter(session_id=session_id).values_list("outcome", flat=True)
    ) == ["cancelled"]
    move = Transition.objects.filter(session_id=session_id).latest("id")
    assert (move.trigger, move.to_state, move.actor, move.reason) == (
        "cancel",
        "cancelled",
        "ws:alice",
        "interrupted by the client",
    )


# Double texting -----------------------------------------------------------------------------------------


def test_double_texting_interrupt_stops_the_running_turn_then_runs_the_new_one(live_stack: Stack):
    _agent("interrupting", options={"latency_s": 1.5}, double_texting="interrupt")
    key = api_key_for("alice")
    with api(live_stack, key) as client:
        session_id = create_session(client, "interrupting")
        post_message(client, session_id, "first")
        _wait_leased(session_id)
        time.sleep(0.3)  # inside the model call
        started = time.monotonic()
        post_message(client, session_id, "second")
        events = wait_events(
            client, session_id, turns_finished(2), 20, lambda: live_stack.log_tail("worker")
        )
        took = time.monotonic() - started
        messages = get_messages(client, session_id)

    _gapless(events)
    finished = [e for e in events if e["type"] == "turn.finished"]
    assert [(e["data"]["turn"], e["data"]["stop_reason"]) for e in finished] == [
        (1, "interrupted"),
        (2, "answer"),
    ]
    second_user = next(
        e for e in events if e["type"] == "message.completed" and e["data"]["content"] == "second"
    )
    assert finished[0]["seq"] < second_user["seq"]  # the new turn starts after the old one stopped
    assert [(m["turn"], m["role"], m["content"]) for m in messages] == [
        (1, "user", "first"),
        (2, "user", "second"),
        (2, "assistant", "Echo: second"),
    ]
    assert took < 1.5 + 2.5, took  # the first model call was closed, not waited for
    outcomes = list(
        ModelCall.objects.filter(session_id=session_id)
        .order_by("turn")
        .values_list("turn", "outcome")
    )
    assert outcomes == [(1, "cancelled"), (2, "success")]


def test_double_texting_reject_answers_409_while_a_turn_runs(live_stack: Stack):
    _agent("rejecting", options={"latency_s": 1.0}, double_texting="reject")
    key = api_key_for("alice")
    with api(live_stack, key) as client:
        session_id = create_session(client, "rejecting")
        post_message(client, session_id, "first")
        refused = client.post(
            f"/api/v1/sessions/{session_id}/messages/", json={"content": "too soon"}
        )
        wait_events(client, session_id, turns_finished(1), 15)
        post_message(client, session_id, "after")
        events = wait_events(client, session_id, turns_finished(2), 15)
        messages = get_messages(client, session_id)

    assert refused.status_code == 409, refused.text
    assert refused.json()["error"]["code"] == "turn_in_progress"
    assert [m["content"] for m in messages] == ["first", "Echo: first", "after", "Echo: after"]
    assert not Message.objects.filter(session_id=session_id, content="too soon").exists()
    _gapless(events)


# Fork ----------------------------------------------------------------------------------------------------------


def test_a_fork_from_a_middle_checkpoint_leaves_the_original_alone_and_is_told_what_changed(
    live_stack: Stack,
):
    demo_install()
    agent = _agent(
        "forking",
        tools=["query_orders"],
        rules=[
            {"when": {"last_tool": None}, "tool_calls": [{"tool": "query_orders", "args": {"days": 7, "logistics_status": "exception"}}]},
            {"when": {"last_tool": "query_orders"}, "answer": "Found {{ result.count }} orders."},
        ],
    )  # fmt: skip
    key = api_key_for("alice")
    with api(live_stack, key) as client:
        original = create_session(client, "forking")
        post_message(client, original, "orders with problems?")
        wait_events(client, original, turns_finished(1), 15)
        checkpoints = client.get(f"/api/v1/sessions/{original}/checkpoints/").json()
        before = (
            get_messages(client, original),
            get_events(client, original),
            checkpoints,
            get_session(client, original),
        )

        # The agent gets another tool before the fork continues.
        agent.tools = ["query_orders", "get_order"]
        agent.save()
        middle = next(c for c in checkpoints if c["context"]["phase"] == "tool_results")
        forked = client.post(
            f"/api/v1/sessions/{original}/fork/", json={"checkpoint": middle["step"]}
        )
        assert forked.status_code == 201, forked.text
        fork = forked.json()
        fork_events = wait_events(
            client, fork["id"], turns_finished(1), 15, lambda: live_stack.log_tail("worker")
        )
        fork_messages = get_messages(client, fork["id"])
        after = (
            get_messages(client, original), get_events(client, original),
            client.get(f"/api/v1/sessions/{original}/checkpoints/").json(), get_session(client, original),
        )  # fmt: skip
        missing = client.post(f"/api/v1/sessions/{original}/fork/", json={"checkpoint": 999})

    assert [c["step"] for c in checkpoints] == [4, 3, 2, 1]  # newest first
    assert after == before  # the original is untouched
    assert fork["metadata"]["forked_from"] == original and fork["state"] == "tool_loop"
    original_messages = before[0]
    copied = [
        (m["role"], m["content"], m["tool_calls"])
        for m in original_messages[: middle["message_seq"]]
    ]
    assert [
        (m["role"], m["content"], m["tool_calls"]) for m in fork_messages[: len(copied)]
    ] == copied
    rest = fork_messages[len(copied) :]
    assert [m["role"] for m in rest] == ["system", "assistant"]
    assert "tools now available: get_order" in rest[0]["content"]
    assert (
        rest[1]["content"] == original_messages[-1]["content"]
    )  # the fork continues to the same end
    assert get_session_state(fork["id"]) == "finished"
    _gapless(fork_events)
    steps = list(
        Checkpoint.objects.filter(session_id=fork["id"])
        .order_by("id")
        .values_list("step", flat=True)
    )
    assert steps == list(range(1, len(steps) + 1))
    assert missing.status_code == 404


def get_session_state(session_id: str) -> str:
    return str(Session.objects.values_list("state", flat=True).get(pk=session_id))


# Durable timers ---------------------------------------------------------------------------------------------


def _timer_agent() -> None:
    demo_install()  # the built-in schedule_followup tool
    _agent(
        "reminding",
        tools=["schedule_followup"],
        rules=[
            {"when": {"last_tool": "schedule_followup", "note": "follow-up you scheduled is due"},
             "answer": "Reminder: {{ tools.schedule_followup.note }}"},
            {"when": {"user": "remind me in (\\d+) seconds to (.+)", "last_tool": None},
             "tool_calls": [{"tool": "schedule_followup", "args": {"after_seconds": "{{ match.1 }}", "note": "{{ match.2 }}"}}]},
            {"answer": "?"},
        ],
    )  # fmt: skip


def test_a_timer_fires_after_every_process_was_restarted(live_stack: Stack):
    _timer_agent()
    key = api_key_for("alice")
    with api(live_stack, key) as client:
        session_id = create_session(client, "reminding")
        post_message(client, session_id, "remind me in 4 seconds to call the courier")
        _wait_state(
            client, session_id, {"waiting_timer"}, 15, lambda: live_stack.log_tail("worker")
        )
        due = Session.objects.values_list("timer_due_at", flat=True).get(pk=session_id)
        assert due is not None

    names = ["web", "worker", "beat"]
    for name in names:
        live_stack.stop(name)
    try:
        time.sleep(5.5)  # past the due time, with no process of the platform running
        row = Session.objects.get(pk=session_id)
        assert (row.state, row.timer_due_at) == ("waiting_timer", due)  # nothing fired it meanwhile
    finally:
        for name in names:
            live_stack.restart(name)
        live_stack.wait_ready(60)

    with api(live_stack, key) as client:
        events = wait_events(
            client, session_id, turns_finished(1), 30, lambda: live_stack.log_tail("beat")
        )
        messages = get_messages(client, session_id)
    assert events[-1]["data"]["stop_reason"] == "answer"
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "system", "assistant"]
    assert "call the courier" in messages[3]["content"]
    assert messages[-1]["content"] == "Reminder: call the courier"
    row = Session.objects.get(pk=session_id)
    assert (row.state, row.timer_due_at, row.timer_note) == ("finished", None, "")
    triggers = list(
        Transition.objects.filter(session_id=session_id)
        .order_by("id")
        .values_list("trigger", flat=True)
    )
    assert triggers.count("timer_fired") == 1
    _gapless(events)


def test_cancel_clears_a_timer(live_stack: Stack):
    _timer_agent()
    key = api_key_for("alice")
    with api(live_stack, key) as client:
        session_id = create_session(client, "reminding")
        post_message(client, session_id, "remind me in 2 seconds to check the parcel")
        _wait_state(client, session_id, {"waiting_timer"}, 15)
        cancelled = client.post(f"/api/v1/sessions/{session_id}/cancel/")
        time.sleep(3.0)  # past the due time
        session = get_session(client, session_id)
        events = get_events(client, session_id)

    assert cancelled.status_code == 200 and cancelled.json()["cancelled"] is True
    assert session["state"] == "cancelled"
    row = Session.objects.get(pk=session_id)
    assert (row.timer_due_at, row.timer_note) == (None, "")
    assert not Transition.objects.filter(session_id=session_id, trigger="timer_fired").exists()
    assert (
        events[-1]["type"] == "turn.finished" and events[-1]["data"]["stop_reason"] == "cancelled"
    )
    _gapless(events)


# Resumable streams ---------------------------------------------------------------------------------------------


def _enough(before: list[Frame], more: int, turns: int) -> Callable[[Frame, list[Frame]], bool]:
    """Stop after `more` persisted frames, or once all `turns` finished."""
    want = len(persisted(before)) + more

    def done(_last: Frame, frames: list[Frame]) -> bool:
        every = before + frames
        return (
            len(persisted(every)) >= want
            or sum(f["type"] == "turn.finished" for f in every) >= turns
        )

    return done


def test_reconnecting_during_a_burst_of_events_loses_and_repeats_nothing(live_stack: Stack):
    _agent("bursty", options={"latency_s": 0.1})
    key = api_key_for("alice")
    n = 15
    with api(live_stack, key) as client:
        session_id = create_session(client, "bursty")

        async def scenario() -> tuple[list[Frame], int, int]:
            received: list[Frame] = []
            reconnects = produced_while_away = 0
            async with async_api(live_stack, key) as aclient:
                url = f"/api/v1/sessions/{session_id}/messages/"
                for i in range(n):
                    response = await aclient.post(url, json={"content": f"burst {i}"})
                    assert response.status_code == 202, response.text

                async def stored_after(seq: int) -> int:
                    response = await aclient.get(
                        f"/api/v1/sessions/{session_id}/events/",
                        params={"after": seq, "limit": 1000},
                    )
                    return len(response.json())

                after = 0
                while sum(f["type"] == "turn.finished" for f in received) < n:
                    # Unbounded queue: a clean close reads on to the server's close frame.
                    ws = await ws_connect(live_stack, session_id, key, after=after, max_queue=None)
                    try:
                        frames = await collect_until(ws, _enough(received, 7, n), timeout=20)
                    finally:
                        if reconnects % 2:
                            ws.transport.abort()  # the connection drops
                        else:
                            await ws.close()
                    received += frames
                    after = persisted(received)[-1]["seq"]
                    reconnects += 1
                    waiting = await stored_after(after)
                    await asyncio.sleep(0.15)  # events keep coming while we are away
                    produced_while_away += await stored_after(after) > waiting
            return received, reconnects, produced_while_away

        frames, reconnects, produced_while_away = asyncio.run(scenario())
        events = get_events(client, session_id)

    assert reconnects >= 4 and produced_while_away >= 2, (reconnects, produced_while_away)
    got = persisted(frames)
    assert [f["seq"] for f in got] == list(range(1, len(events) + 1))  # no gap, no duplicate
    assert [(f["seq"], f["type"], f["data"]) for f in got] == [
        (e["seq"], e["type"], e["data"]) for e in events[: len(got)]
    ]
    assert sum(e["type"] == "turn.finished" for e in events) == n
