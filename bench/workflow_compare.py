"""Benchmark: a workflow of ten instant tool nodes against LangGraph + PostgresSaver.

DESIGN "Performance targets": a 10-node tool chain at most 1.0x a LangGraph
`StateGraph` + `PostgresSaver` with the same nodes, side by side in one run; a
workflow node's overhead at most an agent step's.

- **LangGraph**: a `StateGraph` over a state of `input` and one key per node,
  nodes s1 -> s2 -> ... -> s10, each calling `fixtures.chain_step` (the counter
  plus one) on the previous node's output; `PostgresSaver` (psycopg,
  `durability="sync"`: each node's checkpoint is written before the next node
  runs, as the platform's are) in a database of its own on the same PostgreSQL
  server; a fresh `thread_id` per run.
- **Platform**: workflow `bench-chain` (`bench/fixtures.py`: ten `tool` nodes,
  each calling the read-only python tool `bench_step`, whose handler is the same
  `chain_step`), started with `workflows.services.workflow_run_start` (the
  run's session and its turn start, as `POST /workflows/{slug}/runs/` does:
  LangGraph's `invoke` writes its input checkpoint too) and walked with
  `engine.session_run` in this process, no worker.

As in the `langgraph` benchmark, the two alternate run by run (ABAB...) after a
warm-up, and each side's server work is the delta of its own database's
`pg_stat_database` / `pg_stat_user_tables` counters. Per side: wall and CPU per
run and per node, server commits (and, for LangGraph, checkpoint rows) per node.

Then a second pass on the platform alone, with the engine benchmark's probe
(`bench/engine_step.py`) installed: each step's overhead (its wall time minus
the tools' `execute_all` and the model's `complete`, as the engine benchmark
defines it) summed over a run and divided by its nodes is the **node overhead**;
each run is followed by one turn of the engine benchmark's demo agent, whose
steps give the agent loop's **step overhead** in the same window (the same
load), with the engine thread's CPU of both; and SQL statements, round trips
and commits per node. The `engine` benchmark's own figures, when it ran in
this invocation, are in the details.
"""

import cProfile
import io
import os
import pstats
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypedDict

from . import fixtures
from .environment import BENCH_DB, with_database
from .langgraph_compare import _counting_cursor, _Counts
from .results_model import Result, figure
from .runs import MachineLoad, database_server_pid, tree_cpu_s
from .sqlcount import SqlCounter, Tally, server_counters, server_delta
from .stats import percentile, summary

NODES = fixtures.CHAIN_NODES
LANGGRAPH_TABLES = ("checkpoints", "checkpoint_writes", "checkpoint_blobs")


@dataclass
class Side:
    name: str
    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    server_cpu: list[float] = field(default_factory=list)
    server: dict[str, int] = field(default_factory=dict)
    statements: int = 0
    round_trips: int = 0


# --- LangGraph ---------------------------------------------------------------------


def _langgraph_database() -> str:
    return f"{BENCH_DB}_langgraph_wf"


def _table_inserts(database: str) -> dict[str, int]:
    """Rows inserted per LangGraph table (pg_stat_user_tables), for deltas."""
    import psycopg

    with psycopg.connect(
        with_database(os.environ["DATABASE_URL"], database), autocommit=True
    ) as conn:
        rows = conn.execute(
            "SELECT relname, n_tup_ins + n_tup_upd FROM pg_stat_user_tables WHERE relname = ANY(%s)",
            [list(LANGGRAPH_TABLES)],
        ).fetchall()
    return {name: int(n) for name, n in rows}


class _Chain:
    """The compiled graph on a connection of its own; `connect` again starts a new backend
    (the old one exits and flushes its statistics: the warm-up stays out of the deltas)."""

    def __init__(self, graph: Any, url: str, counts: type[_Counts], last: str) -> None:
        self.graph, self.url, self.counts, self.last = graph, url, counts, last
        self.conn: Any = None
        self.app: Any = None

    def connect(self) -> None:
        import psycopg
        from langgraph.checkpoint.postgres import PostgresSaver
        from psycopg.rows import dict_row

        first = self.conn is None
        self.close()
        self.conn = psycopg.connect(
            self.url,
            autocommit=True,
            prepare_threshold=0,
            row_factory=dict_row,
            cursor_factory=_counting_cursor(self.counts),
        )
        saver = PostgresSaver(self.conn)
        if first:
            saver.setup()
        self.app = self.graph.compile(checkpointer=saver)

    def run_once(self) -> None:
        config = {"configurable": {"thread_id": uuid.uuid4().hex}}
        out = self.app.invoke({"input": {"n": 0}}, config, durability="sync")
        if out.get(self.last) != {"n": NODES}:
            raise RuntimeError(f"LangGraph chain ended with {out.get(self.last)!r}")

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


@contextmanager
def _langgraph(counts: type[_Counts]) -> Iterator[_Chain]:
    """The chain on a database of LangGraph's own."""
    import psycopg
    from langgraph.graph import END, START, StateGraph

    base = os.environ["DATABASE_URL"]
    name = _langgraph_database()
    with psycopg.connect(with_database(base, "postgres"), autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')

    keys = [f"s{i}" for i in range(1, NODES + 1)]
    # The state: the input and one key per node (TypedDict's functional form: the keys
    # follow NODES).
    chain_state = TypedDict(  # type: ignore[misc]
        "chain_state", {"input": dict[str, Any], **dict.fromkeys(keys, dict[str, Any])}, total=False
    )

    def node(key: str, previous: str) -> Callable[[Any], dict[str, Any]]:
        def run(state: Any) -> dict[str, Any]:
            return {key: fixtures.chain_step(state[previous]["n"])}

        run.__name__ = key
        return run

    graph = StateGraph(chain_state)
    previous = "input"
    for key in keys:
        graph.add_node(key, node(key, previous))
        graph.add_edge(START if previous == "input" else previous, key)
        previous = key
    graph.add_edge(previous, END)

    chain = _Chain(graph, with_database(base, name), counts, keys[-1])
    chain.connect()
    try:
        yield chain
    finally:
        chain.close()


# --- The platform --------------------------------------------------------------------


@dataclass
class Run:
    session_id: Any
    start_s: float  # workflow_run_start: the session and its turn start
    steps: int


def _platform_run(owner: Any) -> Run:
    from engine import session_run
    from workflows.services import workflow_run_start

    started = time.perf_counter()
    session, created = workflow_run_start(
        owner=owner, key_roles=[fixtures.ROLE], slug=fixtures.CHAIN_WORKFLOW, input={"n": 0}
    )
    start_s = time.perf_counter() - started
    assert created
    result = session_run(session_id=session.pk)
    if result.stopped != "idle":
        raise RuntimeError(f"session_run stopped with {result.stopped!r}")
    return Run(session.pk, start_s, result.steps)


def _check_runs(ids: list[Any]) -> None:
    from record.models import Session

    wrong = [
        (str(pk), state, (wf or {}).get("result"))
        for pk, state, wf in Session.objects.filter(pk__in=ids).values_list(
            "pk", "state", "workflow_state"
        )
        if state != "finished" or (wf or {}).get("result") != {"n": NODES}
    ]
    if wrong:
        raise RuntimeError(
            f"{len(wrong)} of {len(ids)} runs did not end with n={NODES}: {wrong[0]}"
        )


def _flush() -> None:
    """Close every pooled connection: backends flush their statistics when they exit."""
    from django.db import connection

    connection.close()
    connection.close_pool()
    time.sleep(0.6)


@dataclass
class NodePass:
    """The platform alone under the engine benchmark's probe: workflow runs alternated with
    turns of the agent loop (the engine benchmark's demo agent), so both see the same load."""

    runs: int
    node_overhead_ms: list[float]  # per run: its steps' overheads / nodes
    node_cpu_ms: list[float]  # per run: its steps' engine-thread CPU / nodes
    step_overhead_ms: list[float]  # each agent step
    step_cpu_ms: list[float]
    steps_per_run: float
    sql: Tally  # the workflow runs' steps
    by_state: dict[str, dict[str, Any]]
    start_sql: Tally
    profile_top: list[str] | None = None


def _node_pass(owner: Any, runs: int, profile_path: str | None) -> NodePass:
    from engine import session_run
    from engine.runner import loop as runner
    from record.models import Session
    from workflows.services import workflow_run_start

    from .engine_step import Probe, _turn

    counter = SqlCounter(threading.current_thread())
    counter.install()
    probe = Probe(counter)
    probe.install()
    # The probe names a step by the state it started in; a node step starts in processing.
    states: list[str] = []
    patched_run_step = runner.run_step

    def run_step(session: Any, owner_: str, run: Any = None) -> bool:
        state = session.state
        progressed = patched_run_step(session, owner_, run)
        if progressed and probe.recording:
            states.append(state)
        return progressed

    runner.run_step = run_step  # type: ignore[assignment]
    node_overhead: list[float] = []
    node_cpu: list[float] = []
    agent_steps: list[Any] = []
    mine: list[int] = []  # indices of the workflow runs' steps in probe.steps
    start_sql = Tally()
    profiler = cProfile.Profile() if profile_path else None
    agents = fixtures.sessions_create("bench-demo", max(1, min(8, runs)))
    try:
        _platform_run(owner)  # warm-up, as the engine benchmark's
        for session in agents[:2]:
            _turn(session, probe)
        for i in range(runs):
            before = counter.snapshot()
            run, _ = workflow_run_start(
                owner=owner,
                key_roles=[fixtures.ROLE],
                slug=fixtures.CHAIN_WORKFLOW,
                input={"n": 0},
            )
            start_sql = start_sql.plus(counter.snapshot().minus(before))
            first = len(probe.steps)
            probe.recording = True
            probe.begin()
            if profiler:
                profiler.enable()
            result = session_run(session_id=run.pk)
            if profiler:
                profiler.disable()
            if result.stopped != "idle":
                raise RuntimeError(f"session_run stopped with {result.stopped!r}")
            records = probe.steps[first:]
            mine += range(first, len(probe.steps))
            node_overhead.append(sum(r.overhead for r in records) * 1000 / NODES)
            node_cpu.append(sum(r.cpu for r in records) * 1000 / NODES)
            # Then one turn of the agent loop, as the engine benchmark runs it.
            first = len(probe.steps)
            agent = Session.objects.get(pk=agents[i % len(agents)].pk)
            _turn(agent, probe)
            agent_steps += probe.steps[first:]
            probe.recording = False
    finally:
        runner.run_step = patched_run_step  # type: ignore[assignment]
        probe.uninstall()
        counter.uninstall()
    if len(states) != len(probe.steps):
        raise RuntimeError(f"{len(states)} states for {len(probe.steps)} steps")
    records = [probe.steps[i] for i in mine]
    run_states = [states[i] for i in mine]
    total = Tally()
    for record in records:
        total = total.plus(record.sql)
    by_state: dict[str, dict[str, Any]] = {}
    for state in sorted(set(run_states)):
        group = [r for r, s in zip(records, run_states, strict=True) if s == state]
        by_state[state] = {
            "steps_per_node": round(len(group) / (runs * NODES), 2),
            "overhead_ms": summary([r.overhead * 1000 for r in group]),
            "engine_cpu_ms": summary([r.cpu * 1000 for r in group]),
            "tool_ms_mean": round(sum(r.tool for r in group) / len(group) * 1000, 3),
            "step_commit_ms_mean": round(sum(r.commit_wall for r in group) / len(group) * 1000, 3),
            "statements_mean": round(sum(r.sql.statements for r in group) / len(group), 2),
            "round_trips_mean": round(sum(r.sql.all_round_trips for r in group) / len(group), 2),
            "commits_mean": round(sum(r.sql.commits for r in group) / len(group), 2),
        }
    top = None
    if profiler and profile_path:
        profiler.dump_stats(profile_path)
        buffer = io.StringIO()
        pstats.Stats(profiler, stream=buffer).sort_stats("cumulative").print_stats(40)
        top = buffer.getvalue().splitlines()[:80]
    return NodePass(
        runs=runs,
        node_overhead_ms=node_overhead,
        node_cpu_ms=node_cpu,
        step_overhead_ms=[r.overhead * 1000 for r in agent_steps],
        step_cpu_ms=[r.cpu * 1000 for r in agent_steps],
        steps_per_run=len(records) / runs,
        sql=total,
        by_state=by_state,
        start_sql=start_sql,
        profile_top=top,
    )


def _engine_figures(engine: Result | None) -> dict[str, Any] | None:
    """The engine benchmark's step overhead, when it ran earlier in this invocation."""
    if engine is None or engine.error:
        return None
    values = {f.key: f.value for f in engine.figures}
    return {
        "overhead_p50_ms": values.get("overhead_p50_ms"),
        "overhead_p95_ms": values.get("overhead_p95_ms"),
        "engine_cpu_p50_ms": values.get("engine_cpu_p50_ms"),
    }


def run(
    *,
    runs: int,
    warmup: int = 3,
    node_runs: int | None = None,
    engine: Result | None = None,
    profile_path: str | None = None,
) -> Result:
    from django.db import connection

    node_runs = node_runs or runs
    result = Result(
        name="workflow",
        title=f"Side by side: a {NODES}-node chain of instant tool nodes, LangGraph StateGraph + PostgresSaver against a workflow run",
        params={
            "runs_per_side": runs,
            "warmup_per_side": warmup,
            "nodes": NODES,
            "node_pass_runs": node_runs,
            "langgraph_durability": "sync",
            "workflow": fixtures.CHAIN_WORKFLOW,
            "tool": f"{fixtures.STEP_TOOL} (python, read-only)",
        },
    )
    counts = _Counts
    counts.statements = counts.round_trips = 0
    counter = SqlCounter()
    owner = fixtures.owner()
    with _langgraph(counts) as chain:
        for _ in range(warmup):
            chain.run_once()
            _platform_run(owner)
        # New backends on both sides: the warm-up's statistics are flushed as the old exit
        # (a busy backend sends them at most once a second), before the counters are read.
        chain.connect()
        _flush()
        server = database_server_pid()

        def server_cpu_s() -> float:
            return tree_cpu_s(server) if server else 0.0

        lg, pf = Side("langgraph"), Side("platform")
        lg_db = _langgraph_database()
        lg_before, pf_before = server_counters(lg_db), server_counters(BENCH_DB)
        lg_tables_before = _table_inserts(lg_db)
        counts.statements = counts.round_trips = 0
        counter.install()
        load = MachineLoad()
        load.start()
        done: list[Run] = []
        try:
            for i in range(runs):
                order = ["lg", "pf"] if i % 2 == 0 else ["pf", "lg"]
                for which in order:
                    server_cpu = server_cpu_s()
                    started, cpu = time.perf_counter(), time.process_time()
                    if which == "lg":
                        chain.run_once()
                    else:
                        done.append(_platform_run(owner))
                    side = lg if which == "lg" else pf
                    side.wall.append(time.perf_counter() - started)
                    side.cpu.append(time.process_time() - cpu)
                    side.server_cpu.append(server_cpu_s() - server_cpu)
        finally:
            machine = load.stop()
            counter.uninstall()
        chain.close()
        _flush()
        lg.server = server_delta(server_counters(lg_db), lg_before)
        pf.server = server_delta(server_counters(BENCH_DB), pf_before)
        lg_tables_after = _table_inserts(lg_db)
        lg.statements, lg.round_trips = counts.statements, counts.round_trips
        total = Tally()
        for bucket in ("engine", "heartbeat", "other"):
            total = total.plus(counter.snapshot(bucket))
        pf.statements, pf.round_trips = total.statements, total.all_round_trips
        client_commits = total.commits
        _check_runs([r.session_id for r in done])

    node_pass = _node_pass(owner, node_runs, profile_path)
    connection.close()

    ms = 1000.0
    per_node = runs * NODES

    def p(values: list[float], q: float) -> float:
        return percentile(values, q) * ms

    def server_ms(side: Side) -> float:
        return sum(side.server_cpu) / len(side.server_cpu) * ms / NODES

    checkpoint_rows = {
        t: lg_tables_after.get(t, 0) - lg_tables_before.get(t, 0) for t in LANGGRAPH_TABLES
    }
    ratio = p(pf.wall, 50) / p(lg.wall, 50)
    node_p50 = percentile(node_pass.node_overhead_ms, 50)
    node_p95 = percentile(node_pass.node_overhead_ms, 95)
    step_p50 = percentile(node_pass.step_overhead_ms, 50)
    step_p95 = percentile(node_pass.step_overhead_ms, 95)
    node_cpu = percentile(node_pass.node_cpu_ms, 50)
    step_cpu = percentile(node_pass.step_cpu_ms, 50)
    start_ms = [r.start_s * ms for r in done]
    result.figures += [
        figure("langgraph_run_p50", "LangGraph+PostgresSaver per run, p50", p(lg.wall, 50), "ms"),
        figure(
            "platform_run_p50", "platform per run (start + session_run), p50", p(pf.wall, 50), "ms"
        ),
        figure("langgraph_run_p95", "LangGraph+PostgresSaver per run, p95", p(lg.wall, 95), "ms"),
        figure("platform_run_p95", "platform per run, p95", p(pf.wall, 95), "ms"),
        figure("langgraph_node_p50", "LangGraph per node, p50", p(lg.wall, 50) / NODES, "ms"),
        figure("platform_node_p50", "platform per node, p50", p(pf.wall, 50) / NODES, "ms"),
        figure("ratio_wall_p50", "platform / LangGraph, wall p50", ratio, "x", le=1.0),
        figure(
            "ratio_cpu_p50",
            "platform / LangGraph, CPU p50 (steadier)",
            p(pf.cpu, 50) / p(lg.cpu, 50),
            "x",
        ),
        *(
            [
                figure(
                    "langgraph_server_cpu_per_node",
                    "LangGraph: the database server's CPU per node, mean",
                    server_ms(lg),
                    "ms",
                ),
                figure(
                    "platform_server_cpu_per_node",
                    "platform: the database server's CPU per node, mean",
                    server_ms(pf),
                    "ms",
                ),
            ]
            if server
            else []
        ),
        figure(
            "platform_commits_per_node",
            "platform server commits per node (pg_stat_database)",
            pf.server["xact_commit"] / per_node,
        ),
        figure(
            "platform_client_commits_per_node",
            "platform write commits per node (client; the run's start and lease included)",
            client_commits / per_node,
        ),
        figure(
            "langgraph_commits_per_node",
            "LangGraph server commits per node (pg_stat_database)",
            lg.server["xact_commit"] / per_node,
        ),
        figure(
            "langgraph_checkpoints_per_node",
            "LangGraph checkpoint rows written per node (checkpoints table)",
            checkpoint_rows["checkpoints"] / per_node,
        ),
        figure(
            "node_overhead_p50",
            "platform node overhead (a run's step overheads / nodes), p50",
            node_p50,
            "ms",
        ),
        figure("node_overhead_p95", "platform node overhead, p95", node_p95, "ms"),
        figure(
            "agent_step_overhead_p50",
            "agent loop step overhead (demo agent, turns alternated with the runs), p50",
            step_p50,
            "ms",
        ),
        figure("agent_step_overhead_p95", "agent loop step overhead, p95", step_p95, "ms"),
        figure(
            "node_vs_step_overhead_p50",
            "node overhead / agent step overhead, p50",
            node_p50 / step_p50 if step_p50 else None,
            "x",
            le=1.0,
        ),
        figure(
            "node_vs_step_cpu_p50",
            "engine-thread CPU per node / per agent step, p50 (steadier)",
            node_cpu / step_cpu if step_cpu else None,
            "x",
        ),
        figure(
            "platform_statements_per_node",
            "platform SQL statements per node (session_run)",
            node_pass.sql.statements / (node_pass.runs * NODES),
        ),
    ]

    def side_details(side: Side) -> dict[str, Any]:
        return {
            "wall_ms_per_run": summary([w * ms for w in side.wall]),
            "cpu_ms_per_run": summary([c * ms for c in side.cpu]),
            "per_node": {
                "wall_ms_p50": round(p(side.wall, 50) / NODES, 3),
                "wall_ms_p95": round(p(side.wall, 95) / NODES, 3),
                "cpu_ms_p50": round(p(side.cpu, 50) / NODES, 3),
                "server_cpu_ms_mean": round(server_ms(side), 3),
                "server_commits": round(side.server["xact_commit"] / per_node, 2),
                "rows_written": round(side.server["rows_written"] / per_node, 2),
                "statements": round(side.statements / per_node, 2),
                "round_trips": round(side.round_trips / per_node, 2),
            },
            "server_delta": side.server,
        }

    n = node_pass.runs * NODES
    sql = node_pass.sql
    result.details = {
        "langgraph": {
            **side_details(lg),
            "rows_written_per_node_by_table": {
                t: round(v / per_node, 2) for t, v in checkpoint_rows.items()
            },
        },
        "platform": {
            **side_details(pf),
            "start_ms": summary(start_ms),
            "session_run_ms": summary([w * ms - s for w, s in zip(pf.wall, start_ms, strict=True)]),
            "client_write_commits_per_node": round(client_commits / per_node, 2),
        },
        "node_pass": {
            "runs": node_pass.runs,
            "steps_per_run": round(node_pass.steps_per_run, 2),
            "node_overhead_ms": summary(node_pass.node_overhead_ms),
            "node_engine_cpu_ms": summary(node_pass.node_cpu_ms),
            "agent_steps": len(node_pass.step_overhead_ms),
            "agent_step_overhead_ms": summary(node_pass.step_overhead_ms),
            "agent_step_engine_cpu_ms": summary(node_pass.step_cpu_ms),
            "per_node": {
                "statements": round(sql.statements / n, 2),
                "round_trips": round(sql.all_round_trips / n, 2),
                "reads": round(sql.reads / n, 2),
                "writes": round(sql.writes / n, 2),
                "commits": round(sql.commits / n, 2),
                "rows_written": round(sql.rows_written / n, 2),
                "rows_by_table": {
                    k: round(v / n, 2) for k, v in sorted(sql.rows_by_table.items()) if v
                },
                "by_verb": {k: round(v / n, 2) for k, v in sorted(sql.by_verb.items()) if v},
            },
            "by_state": node_pass.by_state,
            "run_start_per_run": {
                "statements": round(node_pass.start_sql.statements / node_pass.runs, 2),
                "commits": round(node_pass.start_sql.commits / node_pass.runs, 2),
            },
            "profile": profile_path,
            "profile_top": node_pass.profile_top,
        },
        # The engine benchmark of this invocation (its own window), for reference.
        "engine_benchmark": _engine_figures(engine),
        "machine_load": machine,
    }
    result.notes.append(
        f"per run p50 / p95: LangGraph {p(lg.wall, 50):.1f} / {p(lg.wall, 95):.1f} ms, "
        f"platform {p(pf.wall, 50):.1f} / {p(pf.wall, 95):.1f} ms "
        f"(of which the run's start {percentile(start_ms, 50):.1f} ms p50); CPU p50 "
        f"{p(lg.cpu, 50):.1f} vs {p(pf.cpu, 50):.1f} ms"
    )
    result.notes.append(
        f"per node: LangGraph {checkpoint_rows['checkpoints'] / per_node:.2f} checkpoints, "
        f"{lg.server['xact_commit'] / per_node:.2f} server commits; platform "
        f"{client_commits / per_node:.2f} write commits, {pf.server['xact_commit'] / per_node:.2f} "
        f"server commits, {node_pass.steps_per_run / NODES:.2f} steps, "
        f"{sql.statements / n:.2f} statements, {sql.all_round_trips / n:.2f} round trips"
    )
    result.notes.append(
        f"node overhead p50 / p95 {node_p50:.2f} / {node_p95:.2f} ms against the agent loop's "
        f"step overhead p50 / p95 {step_p50:.2f} / {step_p95:.2f} ms in the same pass "
        f"({len(node_pass.step_overhead_ms)} demo steps alternated with the runs); engine-thread "
        f"CPU {node_cpu:.2f} ms per node, {step_cpu:.2f} ms per step"
    )
    return result
