"""The engine in-process: `session_run` called directly after `message_post`, no worker.

These tests need `transaction=True`: tools run on helper threads with their own
database connections, which must see the committed demo data.
"""

import asyncio
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.db.models.functions import Now

from demo.models import Notification, Report
from engine import session_run
from record.models import (
    Agent,
    Checkpoint,
    Event,
    Message,
    ModelEndpoint,
    Session,
    ToolCall,
    Transition,
)
from sessions.services import message_post, session_cancel
from tests.demo_setup import DEMO_REQUEST, demo_install
from tests.event_order import assert_events_in_order
from tests.factories import ToolFactory
from tools.execution import FAILURE_MARKER
from tools.registry import tool_handler

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _events_in_order() -> Iterator[None]:
    """Every run's events, at the test's end, in the order a watcher can render
    (tests/event_order.py)."""
    yield
    assert_events_in_order()


@tool_handler("tests.engine.boom")
def _boom() -> dict:
    raise RuntimeError("kaboom")


@tool_handler("tests.engine.count")
def _count(days: int) -> dict:
    return {"days": days}


def _run(session: Session) -> Session:
    started = time.monotonic()
    result = session_run(session_id=session.pk)
    assert result.stopped == "idle", result
    assert time.monotonic() - started < 20
    return Session.objects.get(pk=session.pk)


def _events(session: Session) -> list[Event]:
    return list(Event.objects.filter(session=session).order_by("seq"))


def _assert_gapless(session: Session) -> None:
    message_seqs = list(
        Message.objects.filter(session=session, seq__isnull=False)
        .order_by("seq")
        .values_list("seq", flat=True)
    )
    assert message_seqs == list(range(1, len(message_seqs) + 1))
    assert message_seqs[-1] == Session.objects.get(pk=session.pk).message_seq
    event_seqs = [e.seq for e in _events(session)]
    assert event_seqs == list(range(1, len(event_seqs) + 1))


@pytest.fixture
def demo_session(make_session):
    demo_install()
    # The demo streams its answer word by word; the tests need no pacing.
    ModelEndpoint.objects.filter(name="rules").update(options={})
    return make_session(agent=Agent.objects.get(slug="order-support"), role="support")


def test_the_demo_request_runs_to_finished(demo_session):
    posted = message_post(session=demo_session, content=DEMO_REQUEST)
    assert posted.message.seq == 1

    session = _run(demo_session)

    assert session.state == "finished"
    assert (session.turn, session.queued_count, session.cancel_requested) == (1, 0, False)
    assert session.lease_owner is None
    calls = list(ToolCall.objects.filter(session=session).order_by("step", "position"))
    names = [c.tool_name for c in calls]
    assert names.count("query_orders") == 1
    assert names.count("send_notification") == 3
    assert names.count("generate_report") == 1
    assert names[0] == "query_orders" and names[-1] == "generate_report"
    assert {c.status for c in calls} == {"success"}
    # Side effects happened once each, keyed by the logical call.
    assert Notification.objects.count() == 3
    assert set(Notification.objects.values_list("idempotency_key", flat=True)) == {
        c.idempotency_key for c in calls if c.tool_name == "send_notification"
    }
    assert Report.objects.count() == 1
    assert {n.order.number for n in Notification.objects.select_related("order")} == {
        "SO-1001",
        "SO-1002",
        "SO-1004",
    }

    _assert_gapless(session)
    messages = list(Message.objects.filter(session=session).order_by("seq"))
    assert [m.role for m in messages] == [
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "tool",
        "tool",
        "assistant",
        "tool",
        "assistant",
    ]
    answer = messages[-1].content
    assert "3 orders" in answer and "3 notifications" in answer
    assert f"report #{Report.objects.get().pk}" in answer

    checkpoints = list(
        Checkpoint.objects.filter(session=session).order_by("id").values_list("step", flat=True)
    )
    assert checkpoints == list(range(1, session.step + 1))
    # Each tool-results commit also moves back to the model: two transitions, one step.
    moves = list(Transition.objects.filter(session=session).order_by("id"))
    folded = sum(1 for t in moves if t.trigger == "model_call")
    assert folded == sum(1 for t in moves if t.trigger == "tool_results") > 0
    assert len(moves) == session.step + folded
    assert [t.version for t in moves] == list(range(1, session.version + 1))

    events = _events(session)
    assert events[-1].type == "turn.finished"
    assert events[-1].data["stop_reason"] == "answer"
    assert [e.type for e in events].count("turn.finished") == 1
    assert [e.data["tool"] for e in events if e.type == "tool.finished"] == names
    assert session.input_tokens > 0 and session.output_tokens > 0


def test_running_a_finished_session_again_does_nothing(demo_session):
    message_post(session=demo_session, content=DEMO_REQUEST)
    before = _run(demo_session)
    events_before = Event.objects.filter(session=before).count()

    result = session_run(session_id=before.pk)

    assert result.steps == 0
    after = Session.objects.get(pk=before.pk)
    assert (after.state, after.version, after.step) == (before.state, before.version, before.step)
    assert Event.objects.filter(session=after).count() == events_before
    assert Notification.objects.count() == 3


def test_two_queued_messages_run_as_two_turns_in_order(make_session):
    session = make_session()
    message_post(session=session, content="one")
    queued = message_post(session=session, content="two").message
    assert queued.seq is None

    session = _run(session)

    assert session.state == "finished" and session.turn == 2 and session.queued_count == 0
    messages = list(Message.objects.filter(session=session).order_by("seq"))
    assert [(m.turn, m.role, m.content) for m in messages] == [
        (1, "user", "one"),
        (1, "assistant", "Echo: one"),
        (2, "user", "two"),
        (2, "assistant", "Echo: two"),
    ]
    turn1 = [m.seq for m in messages if m.turn == 1]
    turn2 = [m.seq for m in messages if m.turn == 2]
    assert max(turn1) < min(turn2)
    finished = [e.data["turn"] for e in _events(session) if e.type == "turn.finished"]
    assert finished == [1, 2]
    _assert_gapless(session)


def test_max_iterations_stops_a_model_that_always_calls_a_tool(make_agent, make_session):
    ToolFactory(name="clock", roles=["support"])
    # The final step offers no tool (its note says so): a model answers.
    rules = [
        {"when": {"note": "Do not call tools"}, "answer": "Out of steps."},
        {"tool_calls": [{"tool": "clock"}]},
    ]
    agent = make_agent(max_iterations=3, tools=["clock"], rules=rules)
    session = make_session(agent=agent)
    message_post(session=session, content="loop forever")

    session = _run(session)

    assert session.state == "finished"
    calls = list(ToolCall.objects.filter(session=session).order_by("step"))
    # The same read-only call three times: run once, then answered from the cache.
    assert [c.cached for c in calls] == [False, True, True]
    assert session.iteration == 4  # three tool rounds, then the final answer without tools
    last = _events(session)[-1]
    assert last.type == "turn.finished" and last.data["stop_reason"] == "max_iterations"
    final = Message.objects.filter(session=session, role="assistant").order_by("-seq").first()
    assert final.content == "Out of steps." and final.tool_calls == []
    move = Transition.objects.filter(session=session).order_by("-id").first()
    assert (move.from_state, move.trigger, move.to_state) == (
        "processing",
        "limit_reached",
        "finished",
    )


def test_an_unknown_tool_is_rejected_and_the_model_told_the_allowed_ones(make_agent, make_session):
    ToolFactory(name="clock", roles=["support"])
    ToolFactory(name="secret", roles=["admin"])
    agent = make_agent(
        tools=["clock", "secret"],
        rules=[
            {"when": {"last_tool": None}, "tool_calls": [{"tool": "launch_rockets"}]},
            {"answer": "gave up"},
        ],
    )
    # A model that calls what it was not offered: the strict rules model would refuse to.
    ModelEndpoint.objects.filter(pk=agent.model_id).update(options={"strict": False})
    session = make_session(agent=agent, role="support")
    message_post(session=session, content="go")

    session = _run(session)

    call = ToolCall.objects.get(session=session)
    assert (call.tool_name, call.status) == ("launch_rockets", "rejected")
    tool_message = Message.objects.get(session=session, role="tool")
    assert tool_message.content.startswith(FAILURE_MARKER)
    assert "unknown tool 'launch_rockets'" in tool_message.content
    assert (
        "Tools you may use: clock." in tool_message.content
    )  # not 'secret': the role may not use it
    assert session.state == "finished"


def test_invalid_arguments_fail_the_call_naming_the_field(make_agent, make_session):
    ToolFactory(
        name="count",
        handler="tests.engine.count",
        roles=["support"],
        parameters={
            "type": "object",
            "properties": {"days": {"type": "integer"}},
            "required": ["days"],
            "additionalProperties": False,
        },
    )
    agent = make_agent(
        tools=["count"],
        rules=[
            {
                "when": {"last_tool": None},
                "tool_calls": [{"tool": "count", "args": {"days": "seven"}}],
            },
            {"answer": "{{ result.status }}"},
        ],
    )
    session = make_session(agent=agent)
    message_post(session=session, content="count")

    session = _run(session)

    call = ToolCall.objects.get(session=session)
    assert call.status == "failed"
    assert "days" in call.error and "integer" in call.error
    tool_message = Message.objects.get(session=session, role="tool")
    assert tool_message.content.startswith(FAILURE_MARKER)
    assert 'days must be an integer; got "seven"' in tool_message.content
    assert session.state == "finished"


def test_a_handler_that_raises_fails_the_call_and_the_run_continues(make_agent, make_session):
    # Failures count in the tool's breaker (shared, in Redis): a name of its own per run.
    boom = f"boom_{uuid.uuid4().hex[:8]}"
    ToolFactory(name=boom, handler="tests.engine.boom", roles=["support"])
    agent = make_agent(
        tools=[boom],
        rules=[
            {"when": {"last_tool": None}, "tool_calls": [{"tool": boom}]},
            {"when": {"last_tool": boom, "result": "failed"}, "answer": "the tool broke"},
            {"answer": "unexpected"},
        ],
    )
    session = make_session(agent=agent)
    message_post(session=session, content="explode")

    session = _run(session)

    call = ToolCall.objects.get(session=session)
    assert call.status == "failed" and "kaboom" in call.error
    assert call.attempts == 1  # an error inside the tool is not retried
    tool_message = Message.objects.get(session=session, role="tool")
    assert (
        tool_message.content
        == f"{FAILURE_MARKER} (status: failed): {boom} failed: RuntimeError: kaboom"
    )
    assert session.state == "finished"
    answer = Message.objects.filter(session=session, role="assistant").order_by("-seq").first()
    assert answer.content == "the tool broke"
    tool_finished = [e for e in _events(session) if e.type == "tool.finished"]
    assert tool_finished[0].data["status"] == "failed"


def test_a_cancel_requested_before_a_step_cancels_the_turn(make_session):
    session = make_session()
    message_post(session=session, content="hello")
    assert session_cancel(session=session) is True

    session = _run(session)

    assert session.state == "cancelled"
    assert session.cancel_requested is False
    assert not Message.objects.filter(session=session, role="assistant").exists()
    last = _events(session)[-1]
    assert last.type == "turn.finished" and last.data["stop_reason"] == "cancelled"
    move = Transition.objects.filter(session=session).order_by("-id").first()
    assert (move.from_state, move.trigger, move.to_state) == ("processing", "cancel", "cancelled")

    # The next message starts a fresh turn that runs normally.
    message_post(session=session, content="again")
    session = _run(session)
    assert session.state == "finished" and session.turn == 2
    _assert_gapless(session)


def test_a_run_that_is_already_leased_elsewhere_is_not_taken(make_session):
    session = make_session()
    message_post(session=session, content="hello")
    Session.objects.filter(pk=session.pk).update(
        lease_owner="other-worker", lease_expires_at=Now() + timedelta(minutes=1)
    )

    result = session_run(session_id=session.pk)

    assert (result.steps, result.stopped) == (0, "not_acquired")
    assert Session.objects.get(pk=session.pk).state == "processing"


def test_a_slow_async_handler_times_out_in_a_real_run(make_agent, make_session):
    @tool_handler("tests.engine.sleepy")
    async def sleepy() -> dict:
        await asyncio.sleep(5)
        return {"slept": True}

    name = f"sleepy_{uuid.uuid4().hex[:8]}"
    ToolFactory(name=name, handler="tests.engine.sleepy", roles=["support"], timeout_s=0.1)
    agent = make_agent(
        tools=[name],
        rules=[
            {"when": {"last_tool": None}, "tool_calls": [{"tool": name}]},
            {"answer": "{{ result.status }}"},
        ],
    )
    session = make_session(agent=agent)
    message_post(session=session, content="sleep")

    started = time.monotonic()
    session = _run(session)

    assert time.monotonic() - started < 3
    call = ToolCall.objects.get(session=session)
    assert (call.status, call.attempts) == ("timeout", 2)  # read-only: retried once
    assert Message.objects.get(session=session, role="tool").content == (
        f"{FAILURE_MARKER} (status: timeout): {name} did not answer within 0.1 s,"
        " 2 times (0.2 s in all)."
    )
    assert (
        Message.objects.filter(session=session, role="assistant").order_by("-seq").first().content
        == "timeout"
    )
