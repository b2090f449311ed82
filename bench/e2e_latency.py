"""Benchmark 3: POST a message -> first websocket frame, and -> `turn.finished`.

Real daphne + one Celery worker + beat on the bench database. Each session
gets a websocket (connected first, with `?after=` its last seq) and then turns
one after another: `POST /api/v1/sessions/{id}/messages/` with httpx, timed
from just before the request to the arrival of the first frame on the socket
(the turn start's `message.completed` / `state.changed`, published by the web
process after its commit) and to `turn.finished` (after the worker's step).
The agent answers at once (`bench-echo`, instant rules model, no tools).
"""

import asyncio
import json
import time
from typing import Any

from . import fixtures
from .procs import Processes
from .results_model import Result, figure
from .runs import MachineLoad
from .stats import percentile, summary


async def _session_turns(
    http: Any,
    ws_base: str,
    key: str,
    session_id: str,
    turns: int,
    samples: list[dict[str, float]],
    warmup: int,
) -> None:
    import websockets

    frames: asyncio.Queue[tuple[float, dict[str, Any]]] = asyncio.Queue()
    url = f"{ws_base}/ws/sessions/{session_id}/?after=0"
    async with websockets.connect(
        url, additional_headers={"Authorization": f"Bearer {key}"}, max_queue=None
    ) as ws:

        async def reader() -> None:
            async for raw in ws:
                await frames.put((time.perf_counter(), json.loads(raw)))

        reading = asyncio.create_task(reader())
        try:
            for turn in range(1, turns + warmup + 1):
                while not frames.empty():
                    frames.get_nowait()
                started = time.perf_counter()
                response = await http.post(
                    f"/api/v1/sessions/{session_id}/messages/",
                    json={"content": f"hello number {turn}"},
                )
                answered = time.perf_counter()
                if response.status_code != 202:
                    raise RuntimeError(
                        f"POST messages: {response.status_code} {response.text[:300]}"
                    )
                first: float | None = None
                first_type = ""
                async with asyncio.timeout(30):
                    while True:
                        at, frame = await frames.get()
                        if first is None:
                            first, first_type = at, frame["type"]
                        if frame["type"] == "turn.finished" and frame["data"].get("turn") == turn:
                            finished = at
                            break
                if turn > warmup:
                    samples.append(
                        {
                            "post_ms": (answered - started) * 1000,
                            "first_ms": (first - started) * 1000,
                            "finished_ms": (finished - started) * 1000,
                            "first_type": first_type,
                        }  # type: ignore[dict-item]
                    )
        finally:
            reading.cancel()


async def _measure(
    base: str, ws_base: str, key: str, ids: list[str], turns: int, warmup: int
) -> list[dict[str, float]]:
    import httpx

    samples: list[dict[str, float]] = []
    async with httpx.AsyncClient(
        base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=30
    ) as http:
        # One session at a time: latency, not throughput.
        for session_id in ids:
            await _session_turns(http, ws_base, key, session_id, turns, samples, warmup)
    return samples


def run(
    procs: Processes, *, sessions: int, turns: int, concurrency: int, warmup: int = 2
) -> Result:
    from django.db import connection

    result = Result(
        name="e2e",
        title="POST message -> first websocket frame / turn.finished (daphne + worker + beat, instant model)",
        params={
            "sessions": sessions,
            "turns_per_session": turns,
            "warmup_turns_per_session": warmup,
            "worker_concurrency": concurrency,
            "agent": "bench-echo",
        },
    )
    procs.start_beat()
    port, _node, web_s, worker_s = procs.web_and_worker(concurrency)
    key = fixtures.api_key("bench-e2e")
    ids = [
        str(s.pk) for s in fixtures.sessions_create("bench-echo", sessions, username="bench-e2e")
    ]
    connection.close()

    load = MachineLoad()
    spies = [
        procs.spy(procs.procs["web"].pid, "e2e-web"),
        procs.spy(procs.procs["worker"].pid, "e2e-worker"),
    ]
    load.start()
    samples = asyncio.run(
        _measure(f"http://127.0.0.1:{port}", f"ws://127.0.0.1:{port}", key, ids, turns, warmup)
    )
    machine = load.stop()
    spy_files = [stop() for stop in spies]

    first = [s["first_ms"] for s in samples]
    finished = [s["finished_ms"] for s in samples]
    posts = [s["post_ms"] for s in samples]
    result.figures = [
        figure(
            "first_event_p50_ms",
            "POST -> first websocket frame, p50",
            percentile(first, 50),
            "ms",
            le=20,
        ),
        figure(
            "first_event_p95_ms",
            "POST -> first websocket frame, p95",
            percentile(first, 95),
            "ms",
            le=50,
        ),
        figure(
            "turn_finished_p50_ms", "POST -> turn.finished, p50", percentile(finished, 50), "ms"
        ),
        figure(
            "turn_finished_p95_ms", "POST -> turn.finished, p95", percentile(finished, 95), "ms"
        ),
        figure("post_p50_ms", "POST response (202), p50", percentile(posts, 50), "ms"),
    ]
    first_types: dict[str, int] = {}
    for s in samples:
        first_types[str(s["first_type"])] = first_types.get(str(s["first_type"]), 0) + 1
    result.details = {
        "turns": len(samples),
        "web_ready_s": round(web_s, 2),
        "worker_ready_s": round(worker_s, 2),
        "first_ms": summary(first),
        "finished_ms": summary(finished),
        "post_ms": summary(posts),
        "first_frame_types": first_types,
        "pyspy": spy_files,
        **machine,
    }
    result.notes.append(
        "Turns run one at a time; each sample is one turn of the echo agent (1 worker step)."
    )
    return result
