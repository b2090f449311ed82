"""`python -m bench.rest_cpu`: CPU per REST request on the hot path, in one process.

Not part of `make bench` (no targets): the measure behind the REST CPU work in
bench/README.md. The real ASGI application (`agentplatform.asgi`, the request
gate included) is called directly, one request at a time, on the bench
database (recreated: do not run it while `make bench` runs in this checkout;
set `BENCH_DATABASE_NAME` apart from other checkouts). Per operation, the
process CPU (`time.process_time`: the loop, Django's sync thread and the
enqueue's sender thread alike) and the wall time per request, p50 of N after a
warm-up. `POST messages` posts into an idle echo session (a turn starts: the
common case), one session per request; no worker runs, the run's Celery queue
is deleted at the end. `--profile` writes a cProfile (CPU clock) of the POSTs.
"""

import argparse
import asyncio
import cProfile
import json
import math
import os
import pstats
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from . import environment, fixtures
from .runs import database_server_pid, tree_cpu_s

Call = Callable[[], Awaitable[tuple[int, bytes]]]


def _asgi_request(app: Any, key: str, method: str, path: str, body: bytes = b"") -> Call:
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"127.0.0.1"),
            (b"authorization", f"Bearer {key}".encode()),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
    }

    async def call() -> tuple[int, bytes]:
        sent = False
        status = 0
        chunks: list[bytes] = []

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await asyncio.sleep(3600)
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))

        await app(dict(scope), receive, send)
        return status, b"".join(chunks)

    return call


def _p50(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


async def _measure(calls: list[Call], expect: int, server: int | None) -> dict[str, float]:
    cpu: list[float] = []
    wall: list[float] = []
    # The server's CPU counts in clock ticks (10 ms): only a round's total over its
    # requests resolves it.
    server_before = tree_cpu_s(server) if server else math.nan
    for call in calls:
        c0, w0 = time.process_time(), time.perf_counter()
        status, body = await call()
        c1, w1 = time.process_time(), time.perf_counter()
        if status != expect:
            raise SystemExit(f"expected {expect}, got {status}: {body[:300]!r}")
        cpu.append((c1 - c0) * 1000)
        wall.append((w1 - w0) * 1000)
    server_cpu = (tree_cpu_s(server) - server_before) if server else math.nan
    return {
        "n": len(calls),
        "cpu_ms_p50": round(_p50(cpu), 3),
        "cpu_ms_mean": round(sum(cpu) / len(cpu), 3),
        "wall_ms_p50": round(_p50(wall), 3),
        "database_cpu_ms_mean": round(server_cpu / len(calls) * 1000, 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.rest_cpu")
    parser.add_argument("-n", type=int, default=300, help="requests per operation")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", metavar="FILE", help="cProfile the POSTs of the last round")
    args = parser.parse_args(argv)
    queue = f"bench-rest-{time.time_ns()}"
    # One key sends (rounds + 2) x n requests in well under a minute: above the default
    # per-key limit (600 a minute) they would be 429s. Counted as in production, never hit.
    os.environ["API_RATE_LIMIT"] = str(10**9)
    with environment.exclusive():
        environment.prepare(queue)
        environment.django_setup()
        fixtures.install()
        from agentplatform.asgi import application

        # The database server's CPU per request (its postmaster and backends, when it
        # runs on this machine): the share of a request no Python change can remove.
        server = database_server_pid()

        key = fixtures.api_key()
        sessions = fixtures.sessions_create("bench-echo", args.n * (args.rounds + 1))
        body = json.dumps({"content": "hello"}).encode()
        posts = [
            _asgi_request(application, key, "POST", f"/api/v1/sessions/{s.pk}/messages/", body)
            for s in sessions
        ]
        gets = [
            _asgi_request(application, key, "GET", f"/api/v1/sessions/{s.pk}/")
            for s in sessions[: args.n]
        ]
        results: dict[str, list[dict[str, float]]] = {"post_message": [], "get_session": []}

        async def run() -> None:
            await _measure(posts[: args.n], 202, server)  # warm-up
            await _measure(gets, 200, server)
            for r in range(args.rounds):
                chunk = posts[(r + 1) * args.n : (r + 2) * args.n]
                profiling = bool(args.profile) and r == args.rounds - 1
                if profiling:
                    _profile_threads(True)
                results["post_message"].append(await _measure(chunk, 202, server))
                if profiling:
                    _profile_threads(False, args.profile)
                results["get_session"].append(await _measure(gets, 200, server))

        asyncio.run(run())
        _queue_delete(queue)
    for name, rounds in results.items():
        print(
            name,
            " | ".join(
                f"cpu p50 {r['cpu_ms_p50']} ms, wall p50 {r['wall_ms_p50']} ms, "
                f"database cpu {r['database_cpu_ms_mean']} ms"
                for r in rounds
            ),
        )
    if args.profile:
        pstats.Stats(args.profile).sort_stats("cumulative").print_stats(40)
    return 0


_profiles: list[cProfile.Profile] = []
_thread_run = threading.Thread.run


def _profiled_run(self: threading.Thread) -> None:
    profiler = cProfile.Profile(time.thread_time)
    _profiles.append(profiler)
    profiler.enable()
    try:
        _thread_run(self)
    finally:
        profiler.disable()


def _profile_threads(on: bool, path: str = "") -> None:
    """cProfile every thread (on the thread's CPU clock): the loop's and the ones it starts.

    Threads already running (the enqueue's sender, a pool's) are not seen. The
    requests' threads are kept between requests (runtime/fastpaths/asgi_threads.py):
    the kept ones are dropped first, so the profiled requests start theirs."""
    if on:
        from runtime.fastpaths.asgi_threads import request_threads

        request_threads.forget()
        _profiles.clear()
        main = cProfile.Profile(time.thread_time)
        _profiles.append(main)
        threading.Thread.run = _profiled_run  # type: ignore[method-assign]
        main.enable()
        return
    _profiles[0].disable()
    threading.Thread.run = _thread_run  # type: ignore[method-assign]
    stats = pstats.Stats(_profiles[0])
    for profiler in _profiles[1:]:
        profiler.create_stats()
        if profiler.stats:  # type: ignore[attr-defined]
            stats.add(profiler)
    stats.dump_stats(path)


def _queue_delete(queue: str) -> None:
    import redis
    from django.conf import settings

    client = redis.Redis.from_url(settings.REDIS_URL)
    for name in client.scan_iter(f"{queue}*"):
        client.delete(name)


if __name__ == "__main__":
    raise SystemExit(main())
