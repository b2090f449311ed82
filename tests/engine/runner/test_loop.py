"""What a step costs the database, counted (not timed): commits and round trips per step.

A read-only tool iteration (the model asks for a call, the call runs) is two
commits: the model step's and the tool results' (which also makes the move
back to the model). Each step writes in one round trip, and its reads are
the few it cannot take from the run's memory or from the previous step's
commit.
"""

import math
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from django.db import connection
from django.db.backends.postgresql.base import DatabaseWrapper

from billing import pressure
from billing.pressure import owner_watch_reset
from engine import session_run
from engine.runner import loop as runner
from record.models import ModelEndpoint, Session, Transition
from sessions.services import message_post
from tests.factories import AgentFactory, ToolFactory
from tools.registry import tool_handler

pytestmark = pytest.mark.django_db(transaction=True)

CALLS = 3
# A step's batch runs as prepared statements (record/rows.py): PREPARE (after a
# DEALLOCATE ALL when the connection is full), then EXECUTE of its UPDATE,
# INSERTs...; only the engine's writes are prepared.
WRITES = ("INSERT", "UPDATE", "DELETE", "PREPARE", "EXECUTE", "DEALLOCATE")


def _writes(sql: str) -> bool:
    return sql.lstrip().split(None, 1)[0].upper() in WRITES


@tool_handler("tests.runner.count")
def count(n: int | None = None) -> dict[str, Any]:
    return {"n": (n or 0) + 1, "text": "x" * 400}


@dataclass
class StepCount:
    state: str
    round_trips: int = 0
    commits: int = 0
    statements: list[str] = field(default_factory=list)
    backends: list[int] = field(default_factory=list)  # the server process of each


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[StepCount]]:
    """Per run_step of the engine thread: round trips (executes, BEGIN and
    COMMIT) and commits (a write run outside a transaction is one; so is an
    explicit COMMIT)."""
    steps: list[StepCount] = []
    current: list[StepCount] = []
    original_run_step = runner.run_step
    original_commit = DatabaseWrapper.commit

    def run_step(session: Session, owner: str, run: Any = None) -> bool:
        current[:] = [StepCount(session.state)]
        progressed = original_run_step(session, owner, run)
        if progressed:
            steps.append(current[0])
        current.clear()
        return progressed

    def commit(wrapper: Any) -> Any:
        if current:
            current[0].commits += 1
            current[0].round_trips += 2  # BEGIN (sent with the first statement) and COMMIT
        return original_commit(wrapper)

    def execute(run: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        if current:
            current[0].round_trips += 1
            current[0].statements.append(sql)
            current[0].backends.append(context["connection"].connection.info.backend_pid)
            if not connection.in_atomic_block and _writes(sql):
                current[0].commits += 1
        return run(sql, params, many, context)

    # The owner's budget watch (billing/pressure.py) is a per-process read kept for
    # OWNER_WATCH_TTL_S (2 s) of wall clock: on a slow, loaded machine it expired in the
    # middle of a counted run and a model step paid one more read than its twin. Here it
    # never expires: read once, at the first model step, then kept, so what a step costs
    # is counted, not how long the steps before it took. (The watch itself is tested in
    # tests/billing.)
    owner_watch_reset()
    monkeypatch.setattr(pressure, "OWNER_WATCH_TTL_S", math.inf)
    monkeypatch.setattr(runner, "run_step", run_step)
    monkeypatch.setattr(DatabaseWrapper, "commit", commit)
    with connection.execute_wrapper(execute):
        yield steps


def _loop_agent(model: ModelEndpoint) -> Any:
    tool = ToolFactory.create(
        name=f"count_{uuid.uuid4().hex[:8]}",
        handler="tests.runner.count",
        side_effects=False,
        parameters={"type": "object", "properties": {"n": {"type": ["integer", "null"]}}},
    )
    return AgentFactory.create(
        slug=f"loop-{uuid.uuid4().hex[:8]}",
        model=model,
        tools=[tool.name],
        max_iterations=CALLS + 2,
        rules=[
            {"name": "answer", "when": {"result": f'"n":{CALLS}[,}}]'}, "answer": "done"},
            {"name": "call", "tool_calls": [{"tool": tool.name, "args": {"n": "{{ result.n }}"}}]},
        ],
    )


def test_a_read_only_tool_iteration_is_two_commits(make_session, rules_model, counted):
    session = make_session(agent=_loop_agent(rules_model))
    message_post(session=session, content="go")

    assert session_run(session_id=session.pk).stopped == "idle"

    kinds = [s.state for s in counted]
    assert kinds == ["processing", "tool_wait"] * CALLS + ["processing"]
    assert all(s.commits == 1 for s in counted), [(s.state, s.statements) for s in counted]
    # One round trip writes the step (no BEGIN / COMMIT of its own).
    for step in counted:
        writes = [sql for sql in step.statements if _writes(sql)]
        assert len(writes) == 1, writes
    # The steps' statements are prepared once per connection (the pool hands out
    # its connections in turn; earlier tests may have prepared them all), then only run.
    held: dict[int, set[str]] = {}
    for step in counted:
        for backend, sql in zip(step.backends, step.statements, strict=True):
            for part in sql.split(";\n"):
                if part.startswith("DEALLOCATE "):  # a full connection starts over
                    held[backend] = set()
                elif part.startswith("PREPARE "):
                    name = part.split(None, 2)[1]
                    assert name not in held.setdefault(backend, set()), (backend, name)
                    held[backend].add(name)
    writes = [sql for step in counted for sql in step.statements if _writes(sql)]
    assert all(sql.startswith(("PREPARE ", "EXECUTE ", "DEALLOCATE ")) for sql in writes), writes
    # Reads: the tool step reads nothing (its open calls, with any cached result,
    # came back with the model step's commit, in the same round trip); model
    # steps after the first read nothing either: the turn's calls (for the loop
    # guards, the calls note and the turn's outcome) are the run's own commits, the
    # lease having seen that the turn had none when the run began.
    tools = [s for s in counted if s.state == "tool_wait"]
    assert [s.round_trips for s in tools] == [1] * CALLS, [s.statements for s in tools]
    models = [s for s in counted if s.state == "processing"]
    assert [s.round_trips for s in models[1:]] == [1, 1, 1], [s.statements for s in models]
    # The first model step reads only the agent's configuration (new to this process) and
    # its tools' recent health (the environment layer's, read once per
    # ENV_TOOL_STATS_TTL_S per process): the history, the owner's memory and budget
    # questions came with the lease.
    reads = [sql for sql in models[0].statements if not _writes(sql)]
    health = [sql for sql in reads if "percentile_disc" in sql]
    assert len(health) <= 1, health
    assert all(
        '"agent_sessions_agent"' in sql or '"tools_tool"' in sql
        for sql in reads
        if sql not in health
    ), reads
    # Both moves of each tool-results commit are recorded.
    moves = list(
        Transition.objects.filter(session=session).order_by("id").values_list("trigger", flat=True)
    )
    assert moves == ["user_message"] + ["tool_calls", "tool_results", "model_call"] * CALLS + [
        "answer"
    ]


def test_a_run_is_its_lease_its_steps_and_nothing_else(make_session, rules_model):
    """Around its steps a run makes one round trip: the lease (with the first reads). The
    last step's commit gives the lease back, on lease_release's condition."""
    session = make_session(agent=_loop_agent(rules_model))
    message_post(session=session, content="go")
    sent: list[str] = []

    def execute(run: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        sent.append(sql)
        return run(sql, params, many, context)

    with connection.execute_wrapper(execute):
        assert session_run(session_id=session.pk).stopped == "idle"

    writes = [sql for sql in sent if _writes(sql)]
    # The lease, then each step's one write: no release of its own.
    assert len(writes) == 1 + 2 * CALLS + 1, writes
    assert "lease_owner = CASE" in runner_text(writes[-1]), writes[-1]
    row = Session.objects.get(pk=session.pk)
    assert (row.state, row.lease_owner, row.lease_expires_at) == ("finished", None, None)


def runner_text(batch: str) -> str:
    """A batch's statements as text (a prepared one by the text this process prepared)."""
    from record.rows import prepared_text

    parts = []
    for part in batch.split(";\n"):
        if part.startswith("EXECUTE "):
            name = part.split()[1].split("(")[0]
            parts.append(prepared_text(name) or part)
        else:
            parts.append(part)
    return ";\n".join(parts)


def test_a_cancel_during_the_tools_stops_at_tool_loop(make_session, rules_model, monkeypatch):
    session = make_session(agent=_loop_agent(rules_model))
    message_post(session=session, content="go")
    original = runner.tool_step

    def tool_step(session: Session, owner: str, keep: object = None) -> None:
        # A client cancels while the tool runs: after the step read the session.
        Session.objects.filter(pk=session.pk).update(
            cancel_requested=True, cancel_reason="stop", cancel_actor="api:someone"
        )
        original(session, owner, keep)

    monkeypatch.setattr(runner, "tool_step", tool_step)

    assert session_run(session_id=session.pk).stopped == "idle"

    moves = list(
        Transition.objects.filter(session=session)
        .order_by("id")
        .values_list("from_state", "trigger", "to_state", "actor")
    )
    assert moves[-2:] == [
        ("tool_wait", "tool_results", "tool_loop", ""),
        ("tool_loop", "cancel", "cancelled", "api:someone"),
    ]


def test_the_context_layers_cost_a_step_no_read(make_session, rules_model, counted):
    """Dialogue state, environment and extra_context ride on what the step reads anyway:
    every step costs what it costs without them, and the new dialogue state is in the
    step's one write."""
    # The first run warms this process's caches (the owner's watch, compiled statements).
    for _ in range(2):
        counted.clear()
        plain = make_session(agent=_loop_agent(rules_model))
        message_post(session=plain, content="go n=7")
        assert session_run(session_id=plain.pk).stopped == "idle"
    without = [(s.state, s.round_trips, s.commits) for s in counted]
    counted.clear()

    agent = _loop_agent(rules_model)
    agent.dialogue = {"slots": [{"name": "n", "patterns": [r"n=(\d+)"]}]}
    agent.save()
    session = make_session(agent=agent)
    message_post(session=session, content="go n=7", extra_context={"page": "loop"})
    assert session_run(session_id=session.pk).stopped == "idle"

    assert [(s.state, s.round_trips, s.commits) for s in counted] == without
    for step in counted:
        assert len([sql for sql in step.statements if _writes(sql)]) == 1
    session.refresh_from_db()
    assert session.dialogue_state["slots"] == {"n": "7"}
    assert session.dialogue_state["turn"] == 1


def test_steps_are_timed_and_paced_by_the_published_delay(make_session, rules_model, monkeypatch):
    """The sweeper published a pacing delay (a slow database): the run pauses that long
    between its steps, and each step lands in this process's health figures."""
    from runtime import health

    figures = health.ProcessFigures(window_s=600)
    monkeypatch.setattr(health, "figures", figures)
    session = make_session(agent=_loop_agent(rules_model))
    message_post(session=session, content="go")
    health.cache_reset()
    health.pacing_publish(health.Pacing(0.2, 900.0, 0.0, ["database"]), ttl_s=30)
    try:
        started = time.monotonic()
        assert session_run(session_id=session.pk).stopped == "idle"
        elapsed = time.monotonic() - started
    finally:
        health._redis().delete(health._pacing_key())
        health.cache_reset()

    steps = 2 * CALLS + 1  # model and tool steps, then the answer
    assert len(figures.steps.recent()) == steps
    assert all(ok for _, _, ok in figures.steps.recent())
    assert elapsed >= 0.2 * (steps - 1), elapsed  # no pause before the first step
    assert figures.inflight == 0
    assert len(figures.model.recent()) == CALLS + 1


def test_a_worker_taking_no_new_runs_requeues_the_run_it_was_handed(
    make_session, rules_model, monkeypatch
):
    """A run prefetched by a worker over its thresholds goes back to the queue (with a
    countdown), and the session is left as it was for whoever takes it."""
    from record import dispatch
    from runtime import health
    from sessions import services

    session = make_session(agent=_loop_agent(rules_model))
    message_post(session=session, content="go")
    before = Session.objects.get(pk=session.pk)
    sent: list[tuple[str, float]] = []
    monkeypatch.setattr(
        dispatch,
        "run_enqueue_later",
        lambda sid, seconds, value=None: sent.append((str(sid), seconds)),
    )
    monitor = health.Monitor("sick@test", lambda accepting: None, interval_s=1)
    monitor.accepting = False
    health.monitors.append(monitor)
    try:
        assert services.session_run_pending(session_id=session.pk).stopped == "requeued"
    finally:
        health.monitors.remove(monitor)
    assert sent == [(str(session.pk), 1.0)]
    row = Session.objects.get(pk=session.pk)
    assert (row.state, row.version, row.lease_owner) == ("processing", before.version, None)
    assert services.session_run_pending(session_id=session.pk).stopped == "idle"
