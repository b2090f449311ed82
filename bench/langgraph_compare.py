"""Benchmark: the platform against LangGraph + PostgresSaver on one scripted loop.

The loop (issue 10): an instant model asks for one tool call, ten times, each
result ~400 characters, then answers.

- **LangGraph**: a `StateGraph` over `messages` (`add_messages`), a model node
  (a function that returns the next `AIMessage` at once) and the prebuilt
  `ToolNode`, checkpointed by `PostgresSaver` (psycopg, `durability="sync"`:
  every step's checkpoint is written before the next step runs, as the
  platform's are) in a database of its own on the same PostgreSQL server,
  invoked with a fresh `thread_id` per run.
- **Platform**: agent `bench-loop` (`bench/fixtures.py`: a rules model with the
  same script, the read-only python tool `bench_lorem`), `services.message_post`
  then `engine.session_run` in this process, a fresh session per run
  (created before the timing: LangGraph's thread needs no creation either).

The two alternate run by run (ABAB...), so load on the machine hits both.
Per side: wall and this process's CPU per run and per iteration (model + tool
round), and per iteration the server's counts from `pg_stat_database` /
`pg_stat_user_tables` deltas of that side's database (transactions, rows
written), with the client's counts (statements, round trips) beside them, and
the database server's CPU per iteration (its processes' CPU from /proc around
each run: the wall time a side spends waiting on the server, which the client's
CPU does not show).
"""

import os
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from . import fixtures
from .environment import BENCH_DB, with_database
from .results_model import Result, figure
from .runs import MachineLoad, database_server_pid, tree_cpu_s
from .sqlcount import SqlCounter, server_counters, server_delta
from .stats import percentile, summary

ITERATIONS = fixtures.LOOP_CALLS


@dataclass
class Side:
    name: str
    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    statements: int = 0
    round_trips: int = 0
    server: dict[str, int] = field(default_factory=dict)
    server_cpu: list[float] = field(default_factory=list)


# --- LangGraph ---------------------------------------------------------------------


class _Counts:
    statements = 0
    round_trips = 0
    pipeline: int | None = None


def _counting_cursor(counts: type[_Counts]) -> type:
    import psycopg

    class CountingCursor(psycopg.Cursor):  # type: ignore[type-arg]
        """Statements and round trips (a pipeline's statements share one)."""

        def _trip(self, statements: int) -> None:
            counts.statements += statements
            pipeline = getattr(self.connection, "_pipeline", None)
            if pipeline is None:
                counts.round_trips += 1
            elif id(pipeline) != counts.pipeline:
                counts.pipeline = id(pipeline)
                counts.round_trips += 1

        def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
            self._trip(1)
            return super().execute(query, params, **kwargs)

        def executemany(self, query: Any, params_seq: Any, **kwargs: Any) -> Any:
            params_seq = list(params_seq)
            self._trip(len(params_seq))  # executemany pipelines its statements: one trip
            return super().executemany(query, params_seq, **kwargs)

    return CountingCursor


def _langgraph_database() -> str:
    return f"{BENCH_DB}_langgraph"


@contextmanager
def _langgraph(counts: type[_Counts]) -> Iterator[tuple[Callable[[], int], Callable[[], None]]]:
    """(run once -> tool rounds done, close) on a database of LangGraph's own."""
    import psycopg
    from langchain_core.messages import AIMessage, ToolMessage
    from langchain_core.tools import tool
    from langgraph.checkpoint.postgres import PostgresSaver
    from langgraph.graph import END, START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition
    from psycopg.rows import dict_row

    base = os.environ["DATABASE_URL"]
    name = _langgraph_database()
    with psycopg.connect(with_database(base, "postgres"), autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')

    @tool
    def lorem(n: int | None = None) -> str:
        """Returns about 400 characters and a counter."""
        return f'{{"n": {(n or 0) + 1}, "text": "{fixtures.LOREM_TEXT}"}}'

    def model(state: MessagesState) -> dict[str, Any]:
        done = sum(1 for m in state["messages"] if isinstance(m, ToolMessage))
        if done >= ITERATIONS:
            return {"messages": [AIMessage(content="done")]}
        call = {"name": "lorem", "args": {"n": done}, "id": f"call_{done}"}
        return {"messages": [AIMessage(content="", tool_calls=[call])]}

    graph = StateGraph(MessagesState)
    graph.add_node("model", model)
    graph.add_node("tools", ToolNode([lorem]))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition)
    graph.add_edge("tools", "model")

    conn = psycopg.connect(
        with_database(base, name),
        autocommit=True,
        prepare_threshold=0,
        row_factory=dict_row,
        cursor_factory=_counting_cursor(counts),
    )
    saver = PostgresSaver(conn)  # type: ignore[arg-type]
    saver.setup()
    app = graph.compile(checkpointer=saver)
    _ = END

    def run_once() -> int:
        config = {"configurable": {"thread_id": uuid.uuid4().hex}}
        out = app.invoke(
            {"messages": [("user", "go")]},
            config,  # type: ignore[arg-type]
            durability="sync",
        )
        rounds = sum(1 for m in out["messages"] if isinstance(m, ToolMessage))
        if rounds != ITERATIONS or out["messages"][-1].content != "done":
            raise RuntimeError(f"LangGraph run ended after {rounds} tool rounds")
        return rounds

    try:
        yield run_once, conn.close
    finally:
        conn.close()


# --- The platform --------------------------------------------------------------------


def _platform_run(session: Any) -> int:
    from engine import session_run
    from sessions.services import message_post

    message_post(session=session, content="go")
    result = session_run(session_id=session.pk)
    if result.stopped != "idle":
        raise RuntimeError(f"session_run stopped with {result.stopped!r}")
    return result.steps


def run(*, runs: int, warmup: int = 3) -> Result:
    from django.db import connection

    from record.models import Message, ToolCall

    result = Result(
        name="langgraph",
        title="Side by side: LangGraph + PostgresSaver against the platform (10 tool rounds)",
        params={
            "runs_per_side": runs,
            "warmup_per_side": warmup,
            "iterations_per_run": ITERATIONS,
            "tool_result_chars": len(fixtures.LOREM_TEXT),
            "langgraph_durability": "sync",
            "agent": "bench-loop",
        },
    )
    counts = _Counts
    counts.statements = counts.round_trips = 0
    counter = SqlCounter()
    with _langgraph(counts) as (langgraph_once, langgraph_close):
        sessions = fixtures.sessions_create("bench-loop", runs + warmup)
        for i in range(warmup):
            langgraph_once()
            _platform_run(sessions[runs + i])
        check = sessions[runs]
        calls = ToolCall.objects.filter(session=check).count()
        if calls != ITERATIONS:
            raise RuntimeError(f"the platform's loop made {calls} tool calls, not {ITERATIONS}")

        def flush() -> None:
            connection.close()
            connection.close_pool()
            time.sleep(0.6)

        flush()
        server = database_server_pid()

        def server_cpu_s() -> float:
            return tree_cpu_s(server) if server else 0.0

        lg, pf = Side("langgraph"), Side("platform")
        lg_db = _langgraph_database()
        # The LangGraph connection stays open: its statistics are flushed when it closes.
        lg_before, pf_before = server_counters(lg_db), server_counters(BENCH_DB)
        counts.statements = counts.round_trips = 0
        counter.install()
        load = MachineLoad()
        load.start()
        try:
            for i in range(runs):
                order = [("lg", None), ("pf", sessions[i])]
                if i % 2:
                    order.reverse()
                for which, session in order:
                    # The runs alternate on an otherwise idle server: the delta is that
                    # run's server work (its backend, and the WAL its commits write).
                    server_cpu = server_cpu_s()
                    started, cpu = time.perf_counter(), time.process_time()
                    if which == "lg":
                        langgraph_once()
                    else:
                        _platform_run(session)
                    side = lg if which == "lg" else pf
                    side.wall.append(time.perf_counter() - started)
                    side.cpu.append(time.process_time() - cpu)
                    side.server_cpu.append(server_cpu_s() - server_cpu)
        finally:
            machine = load.stop()
            counter.uninstall()
        langgraph_close()
        flush()
        lg.server = server_delta(server_counters(lg_db), lg_before)
        pf.server = server_delta(server_counters(BENCH_DB), pf_before)
        lg.statements, lg.round_trips = counts.statements, counts.round_trips
        total = None
        for bucket in ("engine", "heartbeat", "other"):
            tally = counter.snapshot(bucket)
            total = tally if total is None else total.plus(tally)
        assert total is not None
        pf.statements, pf.round_trips = total.statements, total.all_round_trips
        rows_stored = Message.objects.filter(session__in=sessions[:runs]).count()

    per_iter = runs * ITERATIONS
    ms = 1000.0

    def p(values: list[float], q: float) -> float:
        return percentile(values, q) * ms

    def server_ms(side: Side) -> float:
        """The database server's CPU per iteration, mean over the side's runs."""
        return sum(side.server_cpu) / len(side.server_cpu) * ms / ITERATIONS

    ratio = p(pf.wall, 50) / p(lg.wall, 50)
    cpu_ratio = p(pf.cpu, 50) / p(lg.cpu, 50)
    result.figures += [
        figure("langgraph_run_p50", "LangGraph+PostgresSaver per run, p50", p(lg.wall, 50), "ms"),
        figure("platform_run_p50", "platform per run, p50", p(pf.wall, 50), "ms"),
        figure(
            "langgraph_iteration_p50",
            "LangGraph per model+tool iteration, p50",
            p(lg.wall, 50) / ITERATIONS,
            "ms",
        ),
        figure(
            "platform_iteration_p50",
            "platform per model+tool iteration, p50",
            p(pf.wall, 50) / ITERATIONS,
            "ms",
        ),
        figure("ratio_wall_p50", "platform / LangGraph, wall p50", ratio, "x", le=1.0),
        figure("ratio_cpu_p50", "platform / LangGraph, CPU p50 (steadier)", cpu_ratio, "x"),
        *(
            [
                figure(
                    "langgraph_server_cpu_per_iteration",
                    "LangGraph: the database server's CPU per iteration, mean",
                    server_ms(lg),
                    "ms",
                ),
                figure(
                    "platform_server_cpu_per_iteration",
                    "platform: the database server's CPU per iteration, mean",
                    server_ms(pf),
                    "ms",
                ),
            ]
            if server
            else []
        ),
        figure(
            "platform_commits_per_iteration",
            "platform server commits per iteration (pg_stat_database)",
            pf.server["xact_commit"] / per_iter,
        ),
        figure(
            "langgraph_commits_per_iteration",
            "LangGraph server commits per iteration (pg_stat_database)",
            lg.server["xact_commit"] / per_iter,
        ),
    ]

    def side_details(side: Side) -> dict[str, Any]:
        return {
            "wall_ms_per_run": summary([w * ms for w in side.wall]),
            "cpu_ms_per_run": summary([c * ms for c in side.cpu]),
            "per_iteration": {
                "wall_ms_p50": round(p(side.wall, 50) / ITERATIONS, 3),
                "wall_ms_p95": round(p(side.wall, 95) / ITERATIONS, 3),
                "cpu_ms_p50": round(p(side.cpu, 50) / ITERATIONS, 3),
                "server_cpu_ms_mean": round(server_ms(side), 3),
                "server_commits": round(side.server["xact_commit"] / per_iter, 2),
                "rows_written": round(side.server["rows_written"] / per_iter, 2),
                "statements": round(side.statements / per_iter, 2),
                "round_trips": round(side.round_trips / per_iter, 2),
            },
            "per_run": {
                "server_commits": round(side.server["xact_commit"] / runs, 1),
                "rows_written": round(side.server["rows_written"] / runs, 1),
                "rows_inserted": round(side.server["tables_inserted"] / runs, 1),
                "statements": round(side.statements / runs, 1),
                "round_trips": round(side.round_trips / runs, 1),
            },
            "server_delta": side.server,
        }

    result.details = {
        "langgraph": side_details(lg),
        "platform": side_details(pf),
        "platform_messages_per_run": round(rows_stored / runs, 1),
        "machine_load": machine,
    }
    result.notes.append(
        f"per run p50 / p95: LangGraph {p(lg.wall, 50):.1f} / {p(lg.wall, 95):.1f} ms, "
        f"platform {p(pf.wall, 50):.1f} / {p(pf.wall, 95):.1f} ms; CPU p50 "
        f"{p(lg.cpu, 50):.1f} vs {p(pf.cpu, 50):.1f} ms"
    )
    for side in (lg, pf):
        d = side_details(side)["per_iteration"]
        result.notes.append(
            f"{side.name} per iteration: {d['server_commits']} commits, {d['statements']} statements, "
            f"{d['round_trips']} round trips, {d['rows_written']} rows written (server)"
        )
    return result
