"""Benchmark `approvals`: approval requested -> frame on the approvers' websocket, and
decision -> the session's next step committed (daphne + worker, instant model).

Real processes: daphne (REST and `/ws/approvals/`) and a Celery worker on the
bench database and queue. The agent `bench-approval` calls `bench_gated`, a
tool with `requires_approval: true` (the built-in clock), once per turn. For
each sample, one after another: a turn is posted; the worker's tool step opens
the approval and parks the session in `awaiting_approval`; this process,
connected to `/ws/approvals/` as an approver, notes when the
`approval.requested` frame arrives; then it approves over REST
(`POST /api/v1/approvals/{id}/approve/`) and polls the database (every 5 ms)
for the worker's next step, the `tool_results` transition. Measured:

- **requested -> frame**: the frame's arrival (this process's clock) minus the
  approval's `requested_at` (stamped in the step that commits it; the database
  is on the same machine);
- **decision -> next step**: the `tool_results` transition's `at` minus the
  moment the approve request was sent (the decision commits in that request,
  which wakes the worker after commit).
"""

import asyncio
import json
import os
import time
from datetime import datetime
from typing import Any

from . import fixtures
from .procs import Processes
from .results_model import Result, figure
from .runs import MachineLoad
from .stats import percentile, summary

AGENT = "bench-approval"
TOOL = "bench_gated"
APPROVER = "bench-approver"
POLL_S = 0.005


def _install() -> None:
    from accounts.services import approver_grant
    from record.models import Agent, ModelEndpoint
    from tools.models import Tool

    Tool.objects.update_or_create(
        name=TOOL,
        defaults={
            "description": "The current time (UTC), after a person approves (benchmark).",
            "kind": "python",
            "handler": "builtin.current_time",
            "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
            "side_effects": True,
            "requires_approval": True,
            "roles": [fixtures.ROLE],
        },
    )
    Agent.objects.update_or_create(
        slug=AGENT,
        defaults={
            "name": "bench: one approved tool call, instant model",
            "system_prompt": "Tell the time once approved.",
            "model": ModelEndpoint.objects.get(name=fixtures.INSTANT),
            "tools": [TOOL],
            "rules": [
                {"when": {"last_tool": TOOL}, "answer": "It is {{ result.now }}"},
                {"tool_calls": [{"tool": TOOL, "args": {}}]},
            ],
        },
    )
    approver_grant(username=APPROVER)


def _epoch(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


async def _measure(
    base: str, ws_base: str, key: str, approver_key: str, ids: list[str], warmup: int
) -> list[dict[str, float]]:
    import httpx
    import psycopg
    import websockets

    frames: asyncio.Queue[tuple[float, dict[str, Any]]] = asyncio.Queue()
    samples: list[dict[str, float]] = []
    conn = await psycopg.AsyncConnection.connect(os.environ["DATABASE_URL"], autocommit=True)
    async with (
        httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {key}"}) as http,
        httpx.AsyncClient(
            base_url=base, headers={"Authorization": f"Bearer {approver_key}"}
        ) as approver,
        websockets.connect(
            f"{ws_base}/ws/approvals/",
            additional_headers={"Authorization": f"Bearer {approver_key}"},
            max_queue=None,
        ) as ws,
    ):

        async def reader() -> None:
            async for raw in ws:
                await frames.put((time.time(), json.loads(raw)))

        reading = asyncio.create_task(reader())
        try:
            for i, session_id in enumerate(ids):
                posted = time.time()
                response = await http.post(
                    f"/api/v1/sessions/{session_id}/messages/", json={"content": "time please"}
                )
                if response.status_code != 202:
                    raise RuntimeError(
                        f"POST messages: {response.status_code} {response.text[:300]}"
                    )
                async with asyncio.timeout(30):
                    while True:
                        arrived, frame = await frames.get()
                        data = frame.get("data") or {}
                        if (
                            frame.get("type") == "approval.requested"
                            and data.get("session") == session_id
                        ):
                            break
                decided = time.time()
                answer = await approver.post(f"/api/v1/approvals/{data['id']}/approve/", json={})
                if answer.status_code != 200:
                    raise RuntimeError(f"approve: {answer.status_code} {answer.text[:300]}")
                answered = time.time()
                next_step: float | None = None
                async with asyncio.timeout(30):
                    while next_step is None:
                        cursor = await conn.execute(
                            "SELECT extract(epoch FROM at)::float8 FROM agent_sessions_transition "
                            "WHERE session_id = %s AND trigger = 'tool_results'",
                            [session_id],
                        )
                        row = await cursor.fetchone()
                        if row is None:
                            await asyncio.sleep(POLL_S)
                        else:
                            next_step = float(row[0])
                if i >= warmup:
                    samples.append(
                        {
                            "requested_frame_ms": (arrived - _epoch(data["requested_at"])) * 1000,
                            "post_to_frame_ms": (arrived - posted) * 1000,
                            "decision_next_step_ms": (next_step - decided) * 1000,
                            "approve_post_ms": (answered - decided) * 1000,
                        }
                    )
        finally:
            reading.cancel()
            await conn.close()
    return samples


def run(procs: Processes, *, sessions: int, concurrency: int, warmup: int = 2) -> Result:
    from django.db import connection

    from accounts.services import api_key_create

    result = Result(
        name="approvals",
        title="approval requested -> approvers' websocket frame; decision -> next step committed",
        params={
            "samples": sessions,
            "warmup": warmup,
            "agent": AGENT,
            "worker_concurrency": concurrency,
        },
    )
    _install()
    # `e2e`'s daphne and worker if it ran just before (the CLI hands them on).
    port, _node, web_s, worker_s = procs.web_and_worker(concurrency)
    key = fixtures.api_key("bench-approvals")
    approver_key = api_key_create(username=APPROVER, roles=[], name="bench").raw
    ids = [
        str(s.pk)
        for s in fixtures.sessions_create(AGENT, sessions + warmup, username="bench-approvals")
    ]
    connection.close()

    load = MachineLoad()
    load.start()
    samples = asyncio.run(
        _measure(
            f"http://127.0.0.1:{port}", f"ws://127.0.0.1:{port}", key, approver_key, ids, warmup
        )
    )
    machine = load.stop()

    frame = [s["requested_frame_ms"] for s in samples]
    step = [s["decision_next_step_ms"] for s in samples]
    result.figures = [
        figure("requested_frame_p50_ms", "approval requested -> approvers' frame, p50", percentile(frame, 50), "ms"),
        figure("requested_frame_p95_ms", "approval requested -> approvers' frame, p95", percentile(frame, 95), "ms"),
        figure("decision_step_p50_ms", "decision -> next step committed, p50", percentile(step, 50), "ms"),
        figure("decision_step_p95_ms", "decision -> next step committed, p95", percentile(step, 95), "ms"),
    ]  # fmt: skip
    result.details = {
        "samples": len(samples),
        "web_ready_s": round(web_s, 2),
        "worker_ready_s": round(worker_s, 2),
        "requested_frame_ms": summary(frame),
        "post_to_frame_ms": summary([s["post_to_frame_ms"] for s in samples]),
        "decision_next_step_ms": summary(step),
        "approve_post_ms": summary([s["approve_post_ms"] for s in samples]),
        "machine": machine,
    }
    return result
