"""Benchmark 1: engine overhead per step, in-process, instant `rules` model.

The demo agent's request (find orders, notify each customer, write a report)
runs turn after turn: `services.message_post` (which also commits the turn
start), then `engine.session_run(session_id=...)` in this process, no worker.

A *step* is a `run_step` call that committed something. Its wall time runs
from the end of the previous step (or from the call of `session_run`, so the
first step carries the lease acquisition) to the end of this one: the session
reload at the top of the loop, the reads, the model call, the tools, the
`step_commit` transaction and the after-commit publish hand-off.
Engine overhead = that wall time minus the time inside the model adapter's
`complete()` (the rules "model": tiny, but excluded) minus the time inside
`execute_all` (the demo tools' own queries). What is left is what the engine
itself costs.
"""

import cProfile
import io
import os
import pstats
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import fixtures
from .environment import with_database
from .results_model import Result, figure
from .runs import MachineLoad
from .sqlcount import SqlCounter, Tally
from .stats import percentile, summary


@dataclass
class StepRecord:
    kind: str
    wall: float
    model: float
    tool: float
    sql: Tally
    cpu: float  # CPU of the engine thread (the model and the tools run on other threads)
    commit_wall: float
    commit_cpu: float

    @property
    def overhead(self) -> float:
        return self.wall - self.model - self.tool


@dataclass
class Probe:
    """Timers patched into the runner for the length of the benchmark."""

    counter: SqlCounter
    mark: float = 0.0
    model: float = 0.0
    tool: float = 0.0
    cpu_mark: float = 0.0
    commit_wall: float = 0.0
    commit_cpu: float = 0.0
    sql_mark: Tally = field(default_factory=Tally)
    post_sql: Tally = field(default_factory=Tally)
    tail_sql: Tally = field(default_factory=Tally)
    tail_seconds: float = 0.0
    steps: list[StepRecord] = field(default_factory=list)
    recording: bool = False
    patches: list[tuple[Any, str, Any]] = field(default_factory=list)

    def begin(self) -> None:
        # The counter's bookkeeping (snapshot) stays outside the timed window.
        self.sql_mark = self.counter.snapshot()
        self.model = self.tool = self.commit_wall = self.commit_cpu = 0.0
        self.mark = time.perf_counter()
        self.cpu_mark = time.thread_time()

    def install(self) -> None:
        from engine.runner import loop as runner
        from engine.store import commit
        from llm.base import ModelAdapter
        from tools import execution

        probe = self
        original_run_step = runner.run_step
        original_execute_all = execution.execute_all
        original_complete = ModelAdapter.complete
        original_step_commit = commit.step_commit

        def run_step(session: Any, owner: str, run: Any = None) -> bool:
            state = session.state
            progressed = original_run_step(session, owner, run)
            now = time.perf_counter()
            cpu = time.thread_time()
            sql = probe.counter.snapshot()
            if progressed and probe.recording:
                kind = {"processing": "model", "tool_wait": "tool", "tool_loop": "tool_loop"}.get(
                    state, "turn_start"
                )
                if kind == "model":
                    kind = "model->tools" if session.state == "tool_wait" else "model->answer"
                probe.steps.append(
                    StepRecord(
                        kind,
                        now - probe.mark,
                        probe.model,
                        probe.tool,
                        sql.minus(probe.sql_mark),
                        cpu - probe.cpu_mark,
                        probe.commit_wall,
                        probe.commit_cpu,
                    )
                )
            if progressed:
                # A call that found nothing to do belongs to the run's tail, not to a step.
                # The next step is timed from here: the snapshot above is the bench's work.
                probe.model = probe.tool = probe.commit_wall = probe.commit_cpu = 0.0
                probe.sql_mark = sql
                probe.mark = time.perf_counter()
                probe.cpu_mark = time.thread_time()
            return progressed

        def step_commit(*args: Any, **kwargs: Any) -> Any:
            started, started_cpu = time.perf_counter(), time.thread_time()
            try:
                return original_step_commit(*args, **kwargs)
            finally:
                probe.commit_wall += time.perf_counter() - started
                probe.commit_cpu += time.thread_time() - started_cpu

        async def execute_all(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return await original_execute_all(*args, **kwargs)
            finally:
                probe.tool += time.perf_counter() - started

        async def complete(self: Any, *args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return await original_complete(self, *args, **kwargs)
            finally:
                probe.model += time.perf_counter() - started

        # The engine imports these by name into several modules (runner, model and
        # tool phases, ...): replace every reference, wherever it is.
        self.patches = [(ModelAdapter, "complete", original_complete)]
        ModelAdapter.complete = complete  # type: ignore[method-assign]
        self._replace_everywhere(original_run_step, run_step)
        self._replace_everywhere(original_step_commit, step_commit)
        self._replace_everywhere(original_execute_all, execute_all)

    def _replace_everywhere(self, original: Any, replacement: Any) -> None:
        import sys

        found = False
        for name, module in list(sys.modules.items()):
            if not name.startswith(("engine", "record", "sessions", "tools")) or module is None:
                continue
            for attr, value in list(vars(module).items()):
                if value is original:
                    self.patches.append((module, attr, original))
                    setattr(module, attr, replacement)
                    found = True
        if not found:
            raise RuntimeError(f"could not find {original.__qualname__} to time it")

    def uninstall(self) -> None:
        for owner, name, original in reversed(self.patches):
            setattr(owner, name, original)
        self.patches = []


def _server_stats(database: str) -> dict[str, int]:
    """pg_stat_database counters for the bench database (all its backends), and the
    server's WAL position (every database of the server writes there)."""
    import psycopg

    with psycopg.connect(
        with_database(os.environ["DATABASE_URL"], database), autocommit=True
    ) as conn:
        row = conn.execute(
            "SELECT xact_commit, xact_rollback, tup_inserted, tup_updated, tup_deleted, "
            "(pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::bigint "
            "FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    assert row is not None
    return dict(
        zip(
            [
                "xact_commit",
                "xact_rollback",
                "tup_inserted",
                "tup_updated",
                "tup_deleted",
                "wal_bytes",
            ],
            row,
            strict=True,
        )
    )


def _flush_backends() -> None:
    """Close every pooled connection: backends flush their statistics when they exit."""
    from django.db import connection

    connection.close()
    connection.close_pool()
    time.sleep(0.6)


def _turn(session: Any, probe: Probe) -> tuple[float, int]:
    from engine import session_run
    from sessions.services import message_post

    before = probe.counter.snapshot()
    started = time.perf_counter()
    message_post(session=session, content=fixtures.DEMO_REQUEST)
    posted = time.perf_counter() - started
    if probe.recording:
        probe.post_sql = probe.post_sql.plus(probe.counter.snapshot().minus(before))
    probe.begin()
    result = session_run(session_id=session.pk)
    if probe.recording:
        # What the run costs beyond its steps: the last reload, the idle check, the lease release.
        probe.tail_sql = probe.tail_sql.plus(probe.counter.snapshot().minus(probe.sql_mark))
        probe.tail_seconds += time.perf_counter() - probe.mark
    if result.stopped != "idle":
        raise RuntimeError(
            f"session_run stopped with {result.stopped!r} after {result.steps} steps"
        )
    return posted, result.steps


def run(
    *,
    sessions: int,
    turns: int,
    warmup_turns: int,
    profile_path: str | None = None,
    spy: Callable[[int, str], Callable[[], str | None]] | None = None,
) -> Result:
    from django.db import connection

    from record.models import Checkpoint, Session

    from .environment import BENCH_DB

    result = Result(
        name="engine",
        title="Engine overhead per step (in-process, demo agent, instant rules model)",
        params={
            "sessions": sessions,
            "turns_per_session": turns,
            "warmup_turns": warmup_turns,
            "agent": "bench-demo",
        },
    )
    counter = SqlCounter(threading.current_thread())
    counter.install()
    probe = Probe(counter)
    probe.install()
    try:
        warm = fixtures.sessions_create("bench-demo", 1)[0]
        for _ in range(warmup_turns):
            _turn(warm, probe)
        targets = fixtures.sessions_create("bench-demo", sessions)
        _flush_backends()
        before = _server_stats(BENCH_DB)
        counter_before = counter.snapshot()
        post_times: list[float] = []
        run_steps = 0
        profiler = cProfile.Profile() if profile_path else None
        stop_spy = spy(os.getpid(), "engine") if spy else None
        load = MachineLoad()
        load.start()
        probe.recording = True
        cpu_started = time.process_time()
        thread_cpu_started = time.thread_time()
        started = time.perf_counter()
        if profiler:
            profiler.enable()
        for _ in range(turns):
            for session in targets:
                session = Session.objects.get(pk=session.pk)
                posted, steps = _turn(session, probe)
                post_times.append(posted)
                run_steps += steps
        if profiler:
            profiler.disable()
        elapsed = time.perf_counter() - started
        thread_cpu = time.thread_time() - thread_cpu_started
        cpu = time.process_time() - cpu_started
        probe.recording = False
        spy_file = stop_spy() if stop_spy else None
        machine = load.stop()
        engine_total = counter.snapshot().minus(counter_before)
        other_total = counter.snapshot("other")
        _flush_backends()
        after = _server_stats(BENCH_DB)
    finally:
        probe.uninstall()
        counter.uninstall()

    steps = probe.steps
    n = len(steps)
    if n == 0 or n != run_steps:
        raise RuntimeError(f"recorded {n} steps, session_run reported {run_steps}")
    ms = 1000.0
    overhead = [s.overhead * ms for s in steps]
    wall = [s.wall * ms for s in steps]
    commits = sum(s.sql.commits for s in steps)
    rows = sum(s.sql.rows_written for s in steps)
    statements = sum(s.sql.statements for s in steps)
    round_trips = sum(s.sql.all_round_trips for s in steps)
    turns_done = len(post_times)
    # What the turn start costs: message_post commits it (one transaction of its own).
    post_sql = probe.post_sql
    tail_sql = probe.tail_sql

    result.figures = [
        figure(
            "overhead_p50_ms", "engine overhead per step, p50", percentile(overhead, 50), "ms", le=3
        ),
        figure(
            "overhead_p95_ms", "engine overhead per step, p95", percentile(overhead, 95), "ms", le=8
        ),
        figure(
            "engine_cpu_p50_ms",
            "engine thread CPU per step, p50 (robust to other load)",
            percentile([s.cpu * ms for s in steps], 50),
            "ms",
        ),
        figure(
            "step_wall_p50_ms",
            "step wall time incl. rules model + demo tools, p50",
            percentile(wall, 50),
            "ms",
        ),
        figure("commits_per_step", "commits per step", commits / n),
        figure("rows_per_step", "rows written per step", rows / n),
        figure("statements_per_step", "SQL statements per step", statements / n),
        figure(
            "round_trips_per_step",
            "round trips per step (executes + BEGIN/COMMIT)",
            round_trips / n,
        ),
        figure(
            "post_p50_ms",
            "message_post incl. turn-start commit, p50",
            percentile([t * ms for t in post_times], 50),
            "ms",
        ),
    ]
    by_kind: dict[str, Any] = {}
    for kind in sorted({s.kind for s in steps}):
        group = [s for s in steps if s.kind == kind]
        by_kind[kind] = {
            "steps": len(group),
            "overhead_ms": summary([s.overhead * ms for s in group]),
            "wall_ms": summary([s.wall * ms for s in group]),
            "engine_cpu_ms": summary([s.cpu * ms for s in group]),
            "step_commit_ms": summary([s.commit_wall * ms for s in group]),
            "step_commit_cpu_ms_mean": round(sum(s.commit_cpu for s in group) / len(group) * ms, 3),
            "model_ms_mean": round(sum(s.model for s in group) / len(group) * ms, 3),
            "tool_ms_mean": round(sum(s.tool for s in group) / len(group) * ms, 3),
            "statements_mean": round(sum(s.sql.statements for s in group) / len(group), 2),
            "reads_mean": round(sum(s.sql.reads for s in group) / len(group), 2),
            "writes_mean": round(sum(s.sql.writes for s in group) / len(group), 2),
            "rows_written_mean": round(sum(s.sql.rows_written for s in group) / len(group), 2),
            "commits_mean": round(sum(s.sql.commits for s in group) / len(group), 2),
            "db_ms_mean": round(sum(s.sql.db_seconds for s in group) / len(group) * ms, 3),
        }
    steps_sql = _sum_tallies(s.sql for s in steps)
    server = {k: after[k] - before[k] for k in after}
    checkpoints = list(
        Checkpoint.objects.filter(session__in=targets).values_list("size_bytes", flat=True)
    )
    connection.close()
    # The checkpoint is one statement of step_commit's single batched execute (no round trip
    # of its own): its size and marginal write time are the `checkpoint` benchmark's figures.
    result.figures.append(
        figure(
            # Every index of a table a step writes is one more WAL record per row.
            "wal_bytes_per_step",
            "WAL written per step (whole server: message_post and the tools too)",
            server["wal_bytes"] / n,
            "B",
        )
    )
    result.figures.append(
        figure(
            "checkpoint_bytes_mean",
            "checkpoint size, mean (see the checkpoint benchmark)",
            sum(checkpoints) / max(len(checkpoints), 1),
            "B",
        )
    )
    result.details = {
        "steps": n,
        "turns": turns_done,
        "steps_per_turn": round(n / turns_done, 2),
        "elapsed_s": round(elapsed, 3),
        "steps_per_s_single_thread": round(n / elapsed, 1),
        "overhead_ms": summary(overhead),
        "engine_cpu_ms": summary([s.cpu * ms for s in steps]),
        "step_commit_ms": summary([s.commit_wall * ms for s in steps]),
        "step_commit_cpu_ms": summary([s.commit_cpu * ms for s in steps]),
        "wall_ms": summary(wall),
        "model_ms_mean": round(sum(s.model for s in steps) / n * ms, 3),
        "tool_ms_mean": round(sum(s.tool for s in steps) / n * ms, 3),
        "db_ms_per_step_mean": round(steps_sql.db_seconds / n * ms, 3),
        "cpu_ms_per_step_process": round(cpu / n * ms, 3),
        "cpu_ms_per_step_engine_thread": round(thread_cpu / n * ms, 3),
        "pyspy": spy_file,
        "by_kind": by_kind,
        "sql_per_step": {
            "statements": round(steps_sql.statements / n, 2),
            "round_trips": round(steps_sql.all_round_trips / n, 2),
            "reads": round(steps_sql.reads / n, 2),
            "writes": round(steps_sql.writes / n, 2),
            "savepoints": round(steps_sql.savepoints / n, 2),
            "explicit_commits": round(steps_sql.explicit_commits / n, 3),
            "autocommit_writes": round(steps_sql.autocommit_writes / n, 3),
            "rollbacks": round(steps_sql.rollbacks / n, 3),
            "rows_written": round(steps_sql.rows_written / n, 2),
            "rows_by_table": {
                k: round(v / n, 2) for k, v in sorted(steps_sql.rows_by_table.items()) if v
            },
            "by_verb": {k: round(v / n, 2) for k, v in sorted(steps_sql.by_verb.items()) if v},
        },
        "message_post": {
            "ms": summary([t * ms for t in post_times]),
            "statements": round(post_sql.statements / turns_done, 2),
            "commits": round(post_sql.commits / turns_done, 2),
            "rows_written": round(post_sql.rows_written / turns_done, 2),
            "by_verb": {
                k: round(v / turns_done, 2) for k, v in sorted(post_sql.by_verb.items()) if v
            },
        },
        "run_tail_per_turn": {
            "note": "after the last step: the reload, the idle check and the lease release",
            "ms": round(probe.tail_seconds / turns_done * ms, 3),
            "statements": round(tail_sql.statements / turns_done, 2),
            "commits": round(tail_sql.commits / turns_done, 2),
        },
        "engine_thread_totals": {
            "statements": engine_total.statements,
            "commits": engine_total.commits,
        },
        "tool_handler_threads_total": {
            "statements": other_total.statements,
            "commits": other_total.commits,
            "rows_written": other_total.rows_written,
        },
        "server_pg_stat_database_per_step": {k: round(v / n, 2) for k, v in server.items()},
        "server_note": (
            "pg_stat_database deltas over the measured turns, divided by steps: every backend of the bench "
            "database, so it includes message_post, the demo tools' own writes and read-only autocommit "
            "SELECTs (each one a transaction to the server)"
        ),
        "checkpoint_bytes": summary([float(c) for c in checkpoints], 1),
        **machine,
    }
    result.notes.append(
        "Engine overhead = step wall time minus time inside the rules adapter's complete() and inside "
        "execute_all() (the demo tools' own queries); the session reload and lease work of the run loop are included."
    )
    if profiler and profile_path:
        profiler.dump_stats(profile_path)
        buffer = io.StringIO()
        pstats.Stats(profiler, stream=buffer).sort_stats("cumulative").print_stats(40)
        result.details["profile"] = profile_path
        result.details["profile_top"] = buffer.getvalue().splitlines()[:80]
    return result


def _sum_tallies(tallies: Any) -> Tally:
    total = Tally()
    for tally in tallies:
        total = total.plus(tally)
    return total
