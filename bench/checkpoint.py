"""Benchmark `checkpoint`: checkpoint size and write time per step (target ≤ 2 KB, ≤ 1 ms).

Size: the `size_bytes` of the checkpoints real runs write (in-process
`session_run` of the demo agent, instant rules model: turn start, model and
tool steps, tool-loop moves, the answer), p50 / p95 per step.

Write time: the checkpoint INSERT is one statement of the step's single
batched execute (`step_commit`: one UPDATE ... RETURNING, then messages, tool
calls, events, transition and checkpoint in one round trip), so it has no
round trip of its own to time. Its cost is measured two ways:

1. **Marginal cost in `step_commit`** (the figure with the target): the same
   engine-built steps (`bench/stepkit.py`: tool intent with 1 call, tool
   results, tool-loop move, cycled on leased sessions), committed alternately
   with their checkpoint (the delta dict `build_step` made) and with
   `Step.checkpoint = None`; p50 (p95) of the marginal cost = p50 (p95) of the
   commits with a checkpoint minus p50 (p95) of those without. The same for
   the engine thread's CPU time.
2. **The INSERT alone**: `insert_statement(Checkpoint, [row], CHECKPOINT_COLUMNS)`
   (the SQL `step_commit` batches) built and executed on its own inside a
   transaction (rolled back), for the contexts of the real runs above: an
   upper bound, since it pays a round trip the batched statement does not.
"""

import json
import time
from typing import Any

from . import fixtures, stepkit
from .results_model import Result, figure
from .runs import MachineLoad
from .stats import percentile, summary


def _demo_checkpoints(sessions: int, turns: int) -> list[dict[str, Any]]:
    from engine import session_run
    from record.models import Checkpoint, Session
    from sessions.services import message_post

    targets = fixtures.sessions_create("bench-demo", sessions)
    for _ in range(turns):
        for session in targets:
            message_post(session=Session.objects.get(pk=session.pk), content=fixtures.DEMO_REQUEST)
            result = session_run(session_id=session.pk)
            if result.stopped != "idle":
                raise RuntimeError(f"demo run stopped with {result.stopped!r}")
    found = (
        Checkpoint.objects.filter(session__in=targets)
        .order_by("session_id", "step")
        .values("size_bytes", "context", "state", "turn", "step", "message_seq", "fingerprint")
    )
    return [dict(row) for row in found]


def _ab_commits(
    cycles: int, sessions: int
) -> tuple[dict[str, dict[str, list[float]]], dict[str, list[str]]]:
    """Commit times per arm ("with" / "without" the checkpoint), and the step kind of each."""
    from engine.store.commit import step_commit

    out: dict[str, dict[str, list[float]]] = {
        arm: {"wall_ms": [], "cpu_ms": []} for arm in ("with", "without")
    }
    kinds: dict[str, list[str]] = {"with": [], "without": []}
    leased = stepkit.leased_sessions("bench-noop", sessions)

    def commit(step: Any, arm: str, kind: str) -> None:
        if arm == "without":
            step.checkpoint = None
        started, started_cpu = time.perf_counter(), time.thread_time()
        step_commit(step)
        out[arm]["wall_ms"].append((time.perf_counter() - started) * 1000)
        out[arm]["cpu_ms"].append((time.thread_time() - started_cpu) * 1000)
        kinds[arm].append(kind)

    for cycle in range(cycles):
        session, owner = leased[cycle % sessions]
        # Alternate per cycle, and swap the order within every pair of cycles.
        arm = ("with", "without")[(cycle + cycle // 2) % 2]
        step, rows = stepkit.intents_step(session, owner, 1, f"c{cycle}")
        commit(step, arm, "tool_intent")
        commit(stepkit.results_step(session, owner, rows), arm, "tool_results")
        commit(stepkit.loop_step(session, owner), arm, "tool_loop_move")
    return out, kinds


def _insert_alone(contexts: list[dict[str, Any]], reps: int) -> dict[str, list[float]]:
    from django.db import connection, transaction
    from django.utils import timezone

    from engine.store.commit import CHECKPOINT_COLUMNS
    from record.models import Checkpoint
    from record.rows import insert_statement

    ((session, _owner),) = stepkit.leased_sessions("bench-noop", 1)
    wall: list[float] = []
    cpu: list[float] = []
    for i in range(reps):
        row = contexts[i % len(contexts)]
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1")  # the transaction is open before the clock starts
            started, started_cpu = time.perf_counter(), time.thread_time()
            context = row["context"]
            checkpoint = Checkpoint(
                session_id=session.pk,
                step=1_000_000 + i,
                turn=row["turn"],
                state=row["state"],
                message_seq=row["message_seq"],
                context=context,
                size_bytes=len(json.dumps(context, separators=(",", ":"), default=str)),
                fingerprint=row["fingerprint"],
                created_at=timezone.now(),
            )
            statement = insert_statement(Checkpoint, [checkpoint], CHECKPOINT_COLUMNS)
            assert statement is not None
            with connection.cursor() as cursor:
                cursor.execute(*statement)
            wall.append((time.perf_counter() - started) * 1000)
            cpu.append((time.thread_time() - started_cpu) * 1000)
            transaction.set_rollback(True)
    return {"wall_ms": wall, "cpu_ms": cpu}


def run(*, demo_sessions: int, demo_turns: int, cycles: int, insert_reps: int) -> Result:
    from django.db import connection

    result = Result(
        name="checkpoint",
        title="Checkpoint size and write time per step (in-process)",
        params={
            "demo_sessions": demo_sessions,
            "demo_turns_per_session": demo_turns,
            "ab_cycles": cycles,
            "ab_commits_per_arm": cycles * 3 // 2,
            "insert_alone_reps": insert_reps,
            "write_time_method": "marginal cost in step_commit (with - without checkpoint)",
        },
    )
    load = MachineLoad()
    load.start()
    rows = _demo_checkpoints(demo_sessions, demo_turns)
    sizes = [float(r["size_bytes"]) for r in rows]
    # A warm-up of both arms (first statements of a kind, the agent cache), not recorded.
    _ab_commits(6, 2)
    ab, ab_kinds = _ab_commits(cycles, 4)
    alone = _insert_alone(rows, insert_reps)
    machine = load.stop()
    connection.close()

    def q(values: list[float], pct: float) -> float:
        return percentile(values, pct)

    with_wall, without_wall = ab["with"]["wall_ms"], ab["without"]["wall_ms"]
    with_cpu, without_cpu = ab["with"]["cpu_ms"], ab["without"]["cpu_ms"]
    result.figures = [
        figure("size_p50_bytes", "checkpoint size per step, p50", q(sizes, 50), "B", le=2048),
        figure("size_p95_bytes", "checkpoint size per step, p95", q(sizes, 95), "B", le=2048),
        figure(
            "write_marginal_p50_ms",
            "checkpoint write per step, marginal cost in step_commit, p50",
            q(with_wall, 50) - q(without_wall, 50),
            "ms",
            le=1,
        ),
        figure(
            "write_marginal_p95_ms",
            "checkpoint write per step, marginal cost in step_commit, p95",
            q(with_wall, 95) - q(without_wall, 95),
            "ms",
            le=1,
        ),
        figure(
            "write_marginal_cpu_p50_ms",
            "checkpoint write, marginal engine-thread CPU, p50 (robust to load)",
            q(with_cpu, 50) - q(without_cpu, 50),
            "ms",
        ),
        figure(
            "write_marginal_cpu_p95_ms",
            "checkpoint write, marginal engine-thread CPU, p95 (robust to load)",
            q(with_cpu, 95) - q(without_cpu, 95),
            "ms",
        ),
        figure(
            "insert_alone_p50_ms",
            "checkpoint INSERT alone (own round trip, upper bound), p50",
            q(alone["wall_ms"], 50),
            "ms",
        ),
        figure(
            "insert_alone_p95_ms",
            "checkpoint INSERT alone (own round trip, upper bound), p95",
            q(alone["wall_ms"], 95),
            "ms",
        ),
        figure(
            "step_commit_p50_ms",
            "step_commit with its checkpoint, p50 (for scale)",
            q(with_wall, 50),
            "ms",
        ),
    ]
    by_phase: dict[str, list[float]] = {}
    for row in rows:
        phase = str((row["context"] or {}).get("phase", "?"))
        by_phase.setdefault(phase, []).append(float(row["size_bytes"]))
    with_env = [float(r["size_bytes"]) for r in rows if "env" in (r["context"] or {})]
    kinds = sorted(set(ab_kinds["with"]))

    def arm_by_kind(arm: str, key: str, kind: str) -> list[float]:
        return [v for v, k in zip(ab[arm][key], ab_kinds[arm], strict=True) if k == kind]

    result.details = {
        "checkpoints_read": len(rows),
        "size_bytes": summary(sizes, 1),
        "size_bytes_by_phase": {k: summary(v, 1) for k, v in sorted(by_phase.items())},
        "size_bytes_with_env": summary(with_env, 1),
        "largest_context": max(rows, key=lambda r: r["size_bytes"])["context"] if rows else None,
        "step_commit_ms": {
            arm: {
                "all": summary(ab[arm]["wall_ms"]),
                **{kind: summary(arm_by_kind(arm, "wall_ms", kind)) for kind in kinds},
            }
            for arm in ("with", "without")
        },
        "step_commit_cpu_ms": {
            arm: {
                "all": summary(ab[arm]["cpu_ms"]),
                **{kind: summary(arm_by_kind(arm, "cpu_ms", kind)) for kind in kinds},
            }
            for arm in ("with", "without")
        },
        "marginal_ms_by_kind_p50": {
            kind: round(
                q(arm_by_kind("with", "wall_ms", kind), 50)
                - q(arm_by_kind("without", "wall_ms", kind), 50),
                3,
            )
            for kind in kinds
        },
        "insert_alone_ms": summary(alone["wall_ms"]),
        "insert_alone_cpu_ms": summary(alone["cpu_ms"]),
        **machine,
    }
    result.notes.append(
        "Write time = marginal cost of the checkpoint inside the step's batched commit (p50 of commits "
        "with it minus p50 of the same steps without it; p95 likewise); the INSERT alone, with a round "
        "trip of its own, is an upper bound."
    )
    return result
