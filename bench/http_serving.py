"""Benchmark `http`: REST throughput of the Procfile's web process, and REST during a broadcast.

The Procfile's own lines (`web`, two `worker`s, `beat`), the web started once
per layout: `WEB_PROCESSES` daphnes sharing the port (`agentplatform/web.py`),
1 (one daphne, the old layout) and the Procfile default. Per layout, from this
process (httpx, asyncio, one connection per client):

- POST messages/s: 50 clients post for `seconds` into 200 echo sessions (each
  client its own 4; a post into a running turn is queued, also a 202);
- GET session/s: 50 clients `GET /api/v1/sessions/{id}/` for `seconds`;
- POST latency, one post at a time, without and then with a broadcast: 500
  websockets watch one session (`bench/http_watchers.py`, a process of its
  own) while this process publishes a `progress` frame to that session every
  `BROADCAST_EVERY_S` (`record.publisher.publish_ephemeral`, the path the
  engine's frames take); the watchers record each frame's arrival time.
"""

import asyncio
import json
import os
import subprocess
import sys
import time
from typing import Any

from . import fixtures
from .environment import DATA, ROOT
from .load import procfile_workers, tree_cpu_s
from .procs import Processes, free_port, procfile
from .results_model import Result, figure
from .runs import MachineLoad
from .stats import percentile, summary

CLIENTS = 50
SESSIONS = 200
WATCHERS = 500
BROADCAST_EVERY_S = 0.2
WORKER_PROCESSES = 2


async def _throughput(
    base: str, key: str, ids: list[str], seconds: float, post: bool
) -> dict[str, Any]:
    import httpx

    limits = httpx.Limits(max_connections=CLIENTS, max_keepalive_connections=CLIENTS)
    latencies: list[float] = []
    errors: dict[int, int] = {}
    async with httpx.AsyncClient(
        base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=30, limits=limits
    ) as http:
        deadline = time.perf_counter() + seconds

        async def client(mine: list[str]) -> None:
            i = 0
            while time.perf_counter() < deadline:
                sid = mine[i % len(mine)]
                i += 1
                started = time.perf_counter()
                if post:
                    response = await http.post(
                        f"/api/v1/sessions/{sid}/messages/", json={"content": f"hi {i}"}
                    )
                    ok = response.status_code == 202
                else:
                    response = await http.get(f"/api/v1/sessions/{sid}/")
                    ok = response.status_code == 200
                if ok:
                    latencies.append((time.perf_counter() - started) * 1000)
                else:
                    errors[response.status_code] = errors.get(response.status_code, 0) + 1

        started = time.perf_counter()
        per = max(len(ids) // CLIENTS, 1)
        await asyncio.gather(*(client(ids[c * per : (c + 1) * per] or ids) for c in range(CLIENTS)))
        wall = time.perf_counter() - started
    return {
        "per_s": len(latencies) / wall,
        "count": len(latencies),
        "latency_ms": summary(latencies),
        "errors": errors,
    }


async def _sequential_posts(base: str, key: str, ids: list[str], seconds: float) -> list[float]:
    import httpx

    out: list[float] = []
    async with httpx.AsyncClient(
        base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=30
    ) as http:
        deadline = time.perf_counter() + seconds
        i = 0
        while time.perf_counter() < deadline:
            sid = ids[i % len(ids)]
            i += 1
            started = time.perf_counter()
            response = await http.post(
                f"/api/v1/sessions/{sid}/messages/", json={"content": f"during {i}"}
            )
            if response.status_code == 202:
                out.append((time.perf_counter() - started) * 1000)
            await asyncio.sleep(0.05)
    return out


async def _broadcast(session_id: str, seconds: float) -> int:
    from record.events import EventType
    from record.publisher import publish_ephemeral

    sent = 0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        publish_ephemeral(session_id, EventType.PROGRESS, {"stage": "bench", "sent": time.time()})
        sent += 1
        await asyncio.sleep(BROADCAST_EVERY_S)
    return sent


def _during_broadcast(
    base: str, key: str, ids: list[str], watched: str, seconds: float
) -> dict[str, Any]:
    spec_path = DATA / f"bench-http-{os.getpid()}-watchers.json"
    out_path = DATA / f"bench-http-{os.getpid()}-watchers-out.json"
    spec_path.write_text(
        json.dumps(
            {
                "ws": "ws" + base.removeprefix("http"),
                "key": key,
                "session": watched,
                "count": WATCHERS,
                "seconds": seconds + 1,
            }
        )
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.http_watchers", str(spec_path), str(out_path)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != "ready":
            raise RuntimeError("watchers did not connect")

        async def both() -> tuple[list[float], int]:
            posts, sent = await asyncio.gather(
                _sequential_posts(base, key, ids, seconds), _broadcast(watched, seconds)
            )
            return posts, sent

        posts, sent = asyncio.run(both())
        proc.wait(timeout=120)
        watchers = json.loads(out_path.read_text())
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        spec_path.unlink(missing_ok=True)
        out_path.unlink(missing_ok=True)
    return {"posts_ms": posts, "broadcasts": sent, **watchers}


def run(procs: Processes, *, seconds: float, layouts: tuple[int, ...]) -> Result:
    from django.db import connection

    result = Result(
        name="http",
        title="REST throughput (50 clients) and POST latency during a 500-socket broadcast, per web layout",
        params={
            "clients": CLIENTS,
            "sessions": SESSIONS,
            "seconds_per_measure": seconds,
            "watchers": WATCHERS,
            "broadcast_every_s": BROADCAST_EVERY_S,
            "web_processes": list(layouts),
            "worker_processes": WORKER_PROCESSES,
            "agent": "bench-echo",
        },
    )
    # `sustained`'s workers and beat if it ran just before (the CLI hands them on).
    workers = procfile_workers(procs, WORKER_PROCESSES)
    for name in workers:
        procs.wait_log(name, " ready.")
    key = fixtures.api_key("bench-http")
    ids = [
        str(s.pk) for s in fixtures.sessions_create("bench-echo", SESSIONS, username="bench-http")
    ]
    watched = str(fixtures.sessions_create("bench-echo", 1, username="bench-http")[0].pk)
    connection.close()
    per_layout: dict[str, Any] = {}
    for n in layouts:
        port = free_port()
        procs.port = port
        procs.start_procfile(
            "web",
            env={
                "PORT": str(port),
                "HOST": "127.0.0.1",
                "WEB_PROCESSES": str(n),
                "WS_MAX_SOCKETS_PER_KEY": str(WATCHERS * 2),
                # One key makes thousands of requests a minute here: the per-key rate
                # (600 a minute by default) answered nearly all of them 429. This
                # measures serving, not throttling.
                "API_RATE_LIMIT": "0",
            },
        )
        procs.wait_web()
        base = f"http://127.0.0.1:{port}"
        # Warm-up: every daphne, the pools (as long as a measure, at most 2 s).
        asyncio.run(_throughput(base, key, ids, min(2.0, seconds), post=False))
        web_pid = procs.procs["web"].pid
        load = MachineLoad()
        load.start()
        cpu0 = tree_cpu_s(web_pid)
        posts = asyncio.run(_throughput(base, key, ids, seconds, post=True))
        cpu1 = tree_cpu_s(web_pid)
        gets = asyncio.run(_throughput(base, key, ids, seconds, post=False))
        cpu2 = tree_cpu_s(web_pid)
        post_cpu_ms = (cpu1 - cpu0) / max(posts["count"], 1) * 1000
        get_cpu_ms = (cpu2 - cpu1) / max(gets["count"], 1) * 1000
        quiet = asyncio.run(_sequential_posts(base, key, ids, seconds))
        broadcast = _during_broadcast(base, key, ids, watched, seconds)
        machine = load.stop()
        procs.stop("web")
        per_layout[str(n)] = {
            "post_per_s": round(posts["per_s"], 1),
            "post_latency_ms": posts["latency_ms"],
            "get_per_s": round(gets["per_s"], 1),
            "web_cpu_ms_per_post": round(post_cpu_ms, 2),
            "web_cpu_ms_per_get": round(get_cpu_ms, 2),
            "get_latency_ms": gets["latency_ms"],
            "errors": {"post": posts["errors"], "get": gets["errors"]},
            "post_alone_ms": summary(quiet),
            "post_during_broadcast_ms": summary(broadcast["posts_ms"]),
            "broadcasts": broadcast["broadcasts"],
            "watchers_connect_s": round(broadcast["connect_s"], 2),
            "frames_received": broadcast["frames"],
            "frames_expected": broadcast["broadcasts"] * WATCHERS,
            "fanout_latency_ms": summary(broadcast["latency_ms"]),
            **machine,
        }
        label = f"web={n}"
        refused = {kind: codes for kind, codes in per_layout[str(n)]["errors"].items() if codes}
        if refused:
            # A figure over mostly refused requests is not the server's: say so.
            result.error = f"{label}: non-2xx answers {refused}"
        result.figures += [
            figure(
                f"post_per_s_{n}", f"{label}: POST messages/s, 50 clients", posts["per_s"], "req/s"
            ),
            figure(f"get_per_s_{n}", f"{label}: GET session/s, 50 clients", gets["per_s"], "req/s"),
            figure(
                f"post_cpu_ms_{n}",
                f"{label}: web CPU per POST (all its processes)",
                post_cpu_ms,
                "ms",
            ),
            figure(
                f"get_cpu_ms_{n}", f"{label}: web CPU per GET (all its processes)", get_cpu_ms, "ms"
            ),
            figure(
                f"post_alone_p95_ms_{n}",
                f"{label}: POST p95, one at a time, no broadcast",
                percentile(quiet, 95),
                "ms",
            ),
            figure(
                f"post_broadcast_p95_ms_{n}",
                f"{label}: POST p95 during a {WATCHERS}-socket broadcast",
                percentile(broadcast["posts_ms"], 95),
                "ms",
                le=50,
            ),
            figure(
                f"fanout_p50_ms_{n}",
                f"{label}: broadcast frame arrival at the {WATCHERS} watchers, p50",
                percentile(broadcast["latency_ms"], 50),
                "ms",
            ),
        ]
    result.details = {
        "layouts": per_layout,
        "procfile_web": procfile()["web"],
        "cpus": os.cpu_count(),
    }
    result.notes.append(
        "The clients run in this process (httpx); the 500 watchers in a process of their own."
    )
    return result
