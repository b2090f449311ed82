"""The run's memory of its turn's tool calls (RunContext.turn_calls): the loop
guards (and the turn's outcome) judge from it as they would from the database,
read at most once per run (never when the lease saw the turn without calls) and
again only after a commit the run did not make itself."""

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from engine import run_cache as runtime_cache
from engine import session_run
from engine.gates.guards import CallRecord, canonical_json
from engine.run_cache import RunContext
from engine.runner.lease import lease_acquire, lease_drop
from engine.runner.loop import run_step
from record.models import ModelEndpoint, Session, ToolCall, Transition
from sessions.services import message_post
from tests.factories import AgentFactory, ToolFactory
from tools.registry import tool_handler

pytestmark = pytest.mark.django_db(transaction=True)


@tool_handler("tests.runtime_cache.same")
def same(q: str = "", **_: Any) -> dict[str, Any]:
    # Floats the database writes differently from Python (exponent, negative zero).
    return {"q": q, "big": 1.5e20, "zero": -0.0, "text": "x" * 400}


def _repeating_agent(model: ModelEndpoint) -> Any:
    """Asks for the same call with the same arguments until a guard stops it (a
    tool with side effects: its results are not reused, each run returns its own)."""
    tool = ToolFactory.create(
        name=f"same_{uuid.uuid4().hex[:8]}",
        handler="tests.runtime_cache.same",
        side_effects=True,
        parameters={"type": "object", "properties": {"q": {"type": "string"}}},
    )
    return AgentFactory.create(
        slug=f"same-{uuid.uuid4().hex[:8]}",
        model=model,
        tools=[tool.name],
        max_iterations=10,
        repeat_call_limit=3,
        same_result_limit=5,
        rules=[
            # Stopped by the guard, the final step offers no tool: the model answers.
            {"when": {"note": "Do not call tools"}, "answer": "Stopped."},
            {"name": "call", "tool_calls": [{"tool": tool.name, "args": {"q": "shoes"}}]},
        ],
    )


def _texts(steps: list[list[CallRecord]]) -> list[list[tuple[str, str, str, str]]]:
    """What the guards compare and hash: each call's JSON text."""
    return [
        [(c.tool, canonical_json(c.arguments), canonical_json(c.output), c.status) for c in step]
        for step in steps
    ]


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Every database read of the turn's calls (by its step), and at each judgement
    the memory's answer checked against the database's."""
    seen: list[int] = []
    original_rows = runtime_cache._turn_calls_rows
    original_turn_calls = RunContext.turn_calls

    def rows(session: Session) -> Any:
        seen.append(session.step)
        return original_rows(session)

    def turn_calls(self: RunContext, session: Session) -> Any:
        judged = original_turn_calls(self, session)
        # Read behind the counter's back: what turn_calls_read returns.
        assert _texts(judged) == _texts(runtime_cache._by_step(original_rows(session)))
        return judged

    monkeypatch.setattr(runtime_cache, "_turn_calls_rows", rows)
    monkeypatch.setattr(RunContext, "turn_calls", turn_calls)
    yield seen


def _stop(session: Session) -> tuple[list[str], str]:
    moves = list(
        Transition.objects.filter(session=session).order_by("id").values_list("trigger", flat=True)
    )
    finished = session.events.filter(type="turn.finished").values_list("data", flat=True).get()
    return moves, finished["stop_reason"]


def test_a_run_judges_its_turn_from_memory_without_a_read(make_session, rules_model, reads):
    session = make_session(agent=_repeating_agent(rules_model))
    # The turn starts in the request, not in the run; the lease sees it has no calls yet, so
    # the run knows them all from its own commits (checked against the database at every
    # judgement by the `reads` fixture).
    message_post(session=session, content="go")

    assert session_run(session_id=session.pk).stopped == "idle"

    moves, stop_reason = _stop(session)
    assert stop_reason == "repeated_call"
    assert moves == ["user_message"] + ["tool_calls", "tool_results", "model_call"] * 3 + [
        "limit_reached"
    ]
    assert reads == []


def test_a_takeover_mid_turn_trips_the_repeat_guard_as_one_run_would(
    make_session, rules_model, reads
):
    agent = _repeating_agent(rules_model)
    whole = make_session(agent=agent)
    message_post(session=whole, content="go")
    assert session_run(session_id=whole.pk).stopped == "idle"

    taken = make_session(agent=agent)
    message_post(session=taken, content="go")
    # A first worker runs two model + tool iterations, then dies (its memory with it).
    assert lease_acquire(session_id=taken.pk, owner="first", seconds=30)
    first = RunContext()
    current = Session.objects.get(pk=taken.pk)
    for _ in range(4):
        assert run_step(current, "first", first)
    assert ToolCall.objects.filter(session=taken).count() == 2
    lease_drop(session_id=taken.pk, owner="first")
    reads.clear()

    assert session_run(session_id=taken.pk, owner="second").stopped == "idle"

    assert _stop(taken) == _stop(whole)
    assert len(reads) == 1  # the second worker read the first one's calls once


def test_a_commit_the_run_did_not_make_is_read_from_the_database(make_session, rules_model, reads):
    session = make_session(agent=_repeating_agent(rules_model))
    message_post(session=session, content="go")
    assert lease_acquire(session_id=session.pk, owner="w", seconds=30)
    run = RunContext()
    current = Session.objects.get(pk=session.pk)
    for _ in range(4):
        assert run_step(current, "w", run)
    assert len(run.turn_calls(current)) == 2 and len(reads) == 1

    # Someone else's step (an approval decided, a takeover) adds a call and moves the version.
    ToolCall.objects.create(
        session=session, turn=current.turn, step=current.step + 1, position=0, call_id="other",
        tool_name="elsewhere", input={}, output={"n": 1}, status="success",
        idempotency_key=f"{session.pk}:other",
    )  # fmt: skip
    Session.objects.filter(pk=session.pk).update(version=current.version + 1)
    moved = Session.objects.get(pk=session.pk)

    steps = run.turn_calls(moved)

    assert [[c.tool for c in s] for s in steps][-1] == ["elsewhere"]
    assert len(reads) == 2
    # Known again at that version: no further read.
    assert run.turn_calls(moved) == steps and len(reads) == 2
