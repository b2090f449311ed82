"""Every event the engine writes or streams has the shape record/events.py declares.

A demo turn with tools, a cancel that closes a call, and a failed turn, all on
the real database and the real channel layer; the validator itself is checked
on payloads that are wrong in each way it must catch.
"""

import asyncio
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.layers import get_channel_layer

from engine import session_run
from engine.moves.turn import turn_fail
from engine.runner.lease import lease_acquire, lease_drop
from engine.runner.loop import run_step
from record.events import PAYLOADS, EventType, call_counts, call_kind, turn_outcome
from record.models import Agent, Event, ModelEndpoint, Session, ToolCall
from record.publisher import frames_of, group_name
from sessions.services import message_post, session_cancel
from tests.demo_setup import DEMO_REQUEST, demo_install
from tests.event_shapes import payload_problems

pytestmark = pytest.mark.django_db(transaction=True)

# The types DESIGN.md lists for the websocket stream, in its order.
DESIGN_TYPES = [
    "state.changed",
    "message.delta",
    "message.completed",
    "progress",
    "tool.started",
    "tool.finished",
    "approval.requested",
    "approval.resolved",
    "turn.finished",
    "error",
    # A workflow run's nodes (DESIGN.md "Workflows").
    "node.started",
    "node.finished",
    "node.failed",
    # Agents together (DESIGN.md "Agents together, and model routing").
    "agent.changed",
    "child.started",
    "child.finished",
]


def test_every_type_of_the_contract_has_one_payload_type():
    assert [t.value for t in EventType] == DESIGN_TYPES
    assert set(PAYLOADS) == set(EventType)


@pytest.mark.parametrize(
    ("type_", "data", "problem"),
    [
        ("tool.started", {"call_id": "c", "tool": "t", "turn": 1}, "missing 'input'"),
        ("message.delta", {"text": "hi", "turn": 1, "extra": 1}, "unexpected key 'extra'"),
        ("message.delta", {"text": "hi", "turn": "1"}, "turn: expected an integer"),
        ("message.delta", {"text": "hi", "turn": True}, "turn: expected an integer"),
        (
            "turn.finished",
            {
                "turn": 1,
                "stop_reason": "answer",
                "iterations": 1,
                "usage": {"input_tokens": 1, "output_tokens": 1, "cost": 0},
                "outcome": "ok",
                "calls": {"ok": 0, "failed": 0, "rejected": 0, "expired": 0, "unpaid": 0},
            },
            "usage.cost: expected str",
        ),
        (
            "tool.finished",
            {"call_id": "c", "tool": "t", "status": "s", "error": "", "turn": 1, "probed": 3},
            "probed",
        ),
        ("message.completed", [], "expected an object"),
        ("tool.exploded", {}, "unknown event type"),
    ],
)
def test_the_validator_catches_a_wrong_payload(type_: str, data: Any, problem: str):
    problems = payload_problems(type_, data)
    assert problems and problem in problems[0], problems


def test_the_validator_accepts_optional_keys_left_out_and_nullable_ones_null():
    assert payload_problems("progress", {"stage": "answer_discarded", "turn": 2}) == []
    closed = {"call_id": "c", "tool": "t", "status": "rejected", "error": "x", "turn": 1}
    assert payload_problems("tool.finished", closed) == []
    assert payload_problems("tool.finished", {**closed, "probed": None, "output": None}) == []


def _streamed(session: Session, run: Any) -> list[dict[str, Any]]:
    """Run `run()` while listening on the session's group; the frames it streamed."""

    async def listen() -> list[dict[str, Any]]:
        # One event loop throughout: the layer keeps its channels per loop.
        layer = get_channel_layer()
        channel = await layer.new_channel()
        await layer.group_add(group_name(session.pk), channel)
        try:
            await sync_to_async(run, thread_sensitive=False)()
            frames = []
            while True:
                try:
                    message = await asyncio.wait_for(layer.receive(channel), timeout=1.0)
                except TimeoutError:
                    return frames
                frames += frames_of(message)
        finally:
            await layer.group_discard(group_name(session.pk), channel)

    return async_to_sync(listen)()


def _persisted(session: Session) -> list[Event]:
    return list(Event.objects.filter(session=session).order_by("seq"))


def _assert_all_match(frames: list[tuple[str, Any]]) -> None:
    problems = [(t, p) for t, data in frames for p in payload_problems(t, data)]
    assert problems == []


@pytest.fixture
def demo_session(make_session) -> Session:
    demo_install()
    ModelEndpoint.objects.filter(name="rules").update(options={})
    return make_session(agent=Agent.objects.get(slug="order-support"), role="support")


def test_a_demo_turn_with_tools_writes_and_streams_only_declared_payloads(demo_session):
    message_post(session=demo_session, content=DEMO_REQUEST)

    frames = _streamed(demo_session, lambda: session_run(session_id=demo_session.pk))

    events = _persisted(demo_session)
    _assert_all_match([(e.type, e.data) for e in events])
    assert {e.type for e in events} >= {
        "state.changed",
        "message.completed",
        "tool.started",
        "tool.finished",
        "turn.finished",
    }
    _assert_all_match([(f["type"], f["data"]) for f in frames])
    # Every call ran and succeeded: query_orders, a notification per order, the report.
    (finished,) = [e.data for e in events if e.type == "turn.finished"]
    calls = ToolCall.objects.filter(session=demo_session).count()
    assert finished["outcome"] == "ok" and calls >= 3
    assert finished["calls"] == {"ok": calls, "failed": 0, "rejected": 0, "expired": 0, "unpaid": 0}
    # The stream carries what is not persisted too: the answer's text as it comes.
    assert "message.delta" in {f["type"] for f in frames if f["seq"] is None}


def test_a_cancel_that_closes_a_call_and_a_failed_turn_write_declared_payloads(demo_session):
    message_post(session=demo_session, content=DEMO_REQUEST)
    owner = "tests-events"
    assert lease_acquire(session_id=demo_session.pk, owner=owner, seconds=60)
    # message_post started the turn; the model asks for tools.
    assert run_step(Session.objects.get(pk=demo_session.pk), owner)
    assert Session.objects.get(pk=demo_session.pk).state == "tool_wait"
    lease_drop(session_id=demo_session.pk, owner=owner)

    assert session_cancel(session=demo_session, actor="tester")
    session_run(session_id=demo_session.pk)

    session = Session.objects.get(pk=demo_session.pk)
    assert session.state == "cancelled"
    assert set(ToolCall.objects.filter(session=session).values_list("status", flat=True)) == {
        "rejected"
    }
    # A failed turn: the `error` event, before its turn.finished.
    message_post(session=session, content="again")
    assert lease_acquire(session_id=session.pk, owner=owner, seconds=60)
    session = Session.objects.get(pk=session.pk)
    assert session.state == "processing"  # message_post started the new turn
    turn_fail(session, owner, "the tool may have run twice")

    events = _persisted(session)
    _assert_all_match([(e.type, e.data) for e in events])
    kinds = [e.type for e in events]
    assert "tool.finished" in kinds and "error" in kinds
    closed = next(e.data for e in events if e.type == "tool.finished")
    assert closed["status"] == "rejected" and "elapsed_ms" not in closed
    finished = [e.data for e in events if e.type == "turn.finished"]
    assert [f["stop_reason"] for f in finished] == ["cancelled", "error"]
    # The cancel closed the open call (counted rejected: it never ran); the failed turn had none.
    assert [f["outcome"] for f in finished] == ["stopped", "error"]
    assert finished[0]["calls"]["rejected"] == 1 and sum(finished[1]["calls"].values()) == 0
    session.refresh_from_db()
    assert (session.last_turn_number, session.last_turn_outcome) == (2, "error")


# --- A turn's outcome (DESIGN.md "A turn's outcome") ---------------------------------


@pytest.mark.parametrize(
    ("status", "refusal", "kind"),
    [
        ("success", "", "ok"),
        ("failed", "", "failed"),
        ("timeout", "", "failed"),
        ("rejected", "rejected", "rejected"),
        ("rejected", "", "rejected"),  # the turn ended before it ran
        ("rejected", "expired", "expired"),
        ("rejected", "unpaid", "unpaid"),
    ],
)
def test_a_call_counts_by_its_status_and_why_it_did_not_run(status, refusal, kind):
    assert call_kind(status, refusal) == kind


def test_call_counts_leave_open_calls_out_and_name_every_kind():
    counts = call_counts(
        [("success", ""), ("success", ""), ("rejected", "unpaid"), ("executing", "")]
    )
    assert counts == {"ok": 2, "failed": 0, "rejected": 0, "expired": 0, "unpaid": 1}


NONE = {"ok": 0, "failed": 0, "rejected": 0, "expired": 0, "unpaid": 0}


@pytest.mark.parametrize(
    ("stop_reason", "calls", "outcome"),
    [
        ("answer", NONE, "ok"),
        ("answer", {**NONE, "ok": 3}, "ok"),
        ("answer", {**NONE, "ok": 1, "failed": 1}, "tool_failures"),
        ("answer", {**NONE, "rejected": 3}, "tool_failures"),
        ("answer", {**NONE, "expired": 1}, "tool_failures"),
        ("answer", {**NONE, "unpaid": 3}, "tool_failures"),
        ("max_iterations", {**NONE, "ok": 8}, "stopped"),
        ("budget_exceeded", NONE, "stopped"),
        ("insufficient_credits", {**NONE, "unpaid": 2}, "stopped"),
        ("cancelled", {**NONE, "rejected": 1}, "stopped"),
        ("operator", NONE, "stopped"),
        ("error", {**NONE, "ok": 1}, "error"),
        ("model_unavailable", NONE, "error"),
        ("model_refused", NONE, "error"),
    ],
)
def test_a_turns_outcome_is_an_error_then_a_stop_then_any_call_not_done(
    stop_reason, calls, outcome
):
    assert turn_outcome(stop_reason, calls) == outcome
