"""`python -m bench.replay [-n 100]`: CPU per turn of an evaluation's replay beside running
the same turns (issue 49: "replaying 100 recorded turns costs the platform no more than
running them did").

Not part of `make bench` (no DESIGN target; the figure goes to bench/README.md). In one
process on the bench database (recreated: do not run it while `make bench` runs in this
checkout): N sessions of `bench-one-round` (one read-only tool round, the instant rules
model) each run one turn in-process (`message_post` + the engine's run, as a worker does),
then one evaluation replays those N turns on the same model (`evaluation_run`, as its
Celery task does: a replay session per turn, the tool's result from the record, the scores).
"Running" is measured twice: as the platform serves a turn (the REST POST through the ASGI
application in this process, then the run) and the engine's run alone. Per turn: this process's CPU (`time.process_time`: every thread) and the database server's
(its postmaster and backends, when it runs on this machine), and the wall time. No worker
runs; the run's Celery queue is deleted at the end.
"""

import argparse
import asyncio
import cProfile
import json
import math
import os
import time
from typing import Any

from . import environment, fixtures
from .rest_cpu import _asgi_request
from .runs import database_server_pid, tree_cpu_s


def _measure(work: Any, turns: int, server: int | None) -> dict[str, float]:
    server_before = tree_cpu_s(server) if server else math.nan
    c0, w0 = time.process_time(), time.perf_counter()
    work()
    c1, w1 = time.process_time(), time.perf_counter()
    server_cpu = (tree_cpu_s(server) - server_before) if server else math.nan
    return {
        "turns": turns,
        "cpu_ms_per_turn": round((c1 - c0) * 1000 / turns, 2),
        "database_cpu_ms_per_turn": round(server_cpu * 1000 / turns, 2),
        "wall_ms_per_turn": round((w1 - w0) * 1000 / turns, 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.replay")
    parser.add_argument("-n", type=int, default=100, help="recorded turns (one per session)")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--profile", metavar="FILE", help="cProfile the replays (this thread)")
    args = parser.parse_args(argv)
    queue = f"bench-replay-{time.time_ns()}"
    os.environ["API_RATE_LIMIT"] = str(10**9)  # one key posts every turn: never a 429 here
    with environment.exclusive():
        environment.prepare(queue)
        environment.django_setup()
        fixtures.install()
        from engine import session_run
        from evaluations import selectors, services
        from sessions.services import message_post

        server = database_server_pid()
        owner = fixtures.owner()

        def run_turns(sessions: list[Any]) -> None:
            for session in sessions:
                message_post(session=session, content="what time is it?")
                result = session_run(session_id=session.pk)
                if result.stopped != "idle":
                    raise SystemExit(f"the turn did not end: {result}")

        def evaluate(sessions: list[Any]) -> Any:
            evaluation = services.evaluation_create(
                owner=owner,
                actor="bench",
                sessions=sessions,
                candidate={"model": sessions[0].agent.model.name},
            )
            state = services.evaluation_run(evaluation_id=evaluation.pk)
            if state != "finished":
                raise SystemExit(f"the evaluation ended {state}: {evaluation.error}")
            evaluation.refresh_from_db()
            return evaluation

        from agentplatform.asgi import application

        key = fixtures.api_key()
        body = json.dumps({"content": "what time is it?"}).encode()

        def serve_turns(sessions: list[Any]) -> None:
            """As the platform runs a turn: the REST POST (the ASGI app, in this process),
            then the worker's run (in-process, no Celery hop)."""
            for session in sessions:
                path = f"/api/v1/sessions/{session.pk}/messages/"
                status, answer = asyncio.run(_asgi_request(application, key, "POST", path, body)())
                if status != 202:
                    raise SystemExit(f"POST answered {status}: {answer[:200]!r}")
                result = session_run(session_id=session.pk)
                if result.stopped != "idle":
                    raise SystemExit(f"the turn did not end: {result}")

        warm = fixtures.sessions_create("bench-one-round", args.warmup)
        run_turns(warm[: args.warmup // 2])
        serve_turns(warm[args.warmup // 2 :])
        evaluate(warm)
        engine_only = fixtures.sessions_create("bench-one-round", args.n)
        running_engine = _measure(lambda: run_turns(engine_only), args.n, server)
        recorded = fixtures.sessions_create("bench-one-round", args.n)
        running = _measure(lambda: serve_turns(recorded), args.n, server)
        picked = selectors.sessions_pick(owner_id=owner.pk, ids=[str(s.pk) for s in recorded])
        found: dict[str, Any] = {}
        profiler = cProfile.Profile(time.process_time) if args.profile else None
        if profiler is not None:
            profiler.enable()
        replaying = _measure(lambda: found.update(e=evaluate(picked)), args.n, server)
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(args.profile)
        totals = found["e"].totals
        _queue_delete(queue)
    print(f"running, as served (REST POST + the run)  {running}")
    print(f"running, the engine's run only           {running_engine}")
    print(f"replaying                                {replaying}")
    for name, base in (("as served", running), ("the engine's run only", running_engine)):
        cpu = replaying["cpu_ms_per_turn"] / base["cpu_ms_per_turn"]
        both = (replaying["cpu_ms_per_turn"] + replaying["database_cpu_ms_per_turn"]) / (
            base["cpu_ms_per_turn"] + base["database_cpu_ms_per_turn"]
        )
        print(f"replay / running {name}: CPU {cpu:.2f}x, with the database's {both:.2f}x")
    print(f"trajectory_match {totals['trajectory_match']}, cost_ratio {totals['cost_ratio']}")
    return 0


def _queue_delete(queue: str) -> None:
    import redis
    from django.conf import settings

    client = redis.Redis.from_url(settings.REDIS_URL)
    for name in client.scan_iter(f"{queue}*"):
        client.delete(name)


if __name__ == "__main__":
    raise SystemExit(main())
