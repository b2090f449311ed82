"""The sweeper's work: leases that lapsed, pacing, stale credit reservations and budget
holds, due timers,
questions past their deadline, old checkpoints.
"""

import logging
import time
from datetime import timedelta

import redis
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from approvals.services import (
    SYSTEM_ACTOR,
)
from approvals.states import UNDO_HOLD
from billing.selectors import reservations_open
from billing.services import budget_holds_sweep, credits_close, pool_requests_close, waiting_expire
from engine import (
    StaleSession,
    client_calls_expire,
    open_client_calls,
    open_question,
    pool_wake,
    timer_fire,
    user_answer,
)
from record import dispatch
from record.models import (
    Checkpoint,
    Session,
    ToolCall,
    ToolCallStatus,
)
from record.states import RUNNABLE, STARTS_TURN, TURN_ENDED, IllegalTransition, State
from runtime import health
from sessions.services.approvals import approvals_expire_due
from sessions.sweep_status import sweep_mark_completed, sweep_slot_take

logger = logging.getLogger(__name__)


def sessions_sweep_scheduled() -> list[str]:
    """Beat's sweep: skipped when another beat's sweep already ran this interval
    (sweep_status.sweep_slot_take), so every worker host may run beat."""
    if not sweep_slot_take(interval_s=settings.SWEEPER_INTERVAL_S):
        return []
    return sessions_sweep()


def sessions_sweep() -> list[str]:
    """Requeue runs whose lease ran out and queued turns nobody runs; wake due timers.

    A run whose worker died is marked `resume_check`: its next step runs the business
    prechecks and the drift check (engine/gates/revalidation.py, environment.py).

    Claiming a session here pushes its lease expiry one pickup grace ahead, so
    a sweep every half second does not enqueue the same session each time.
    """
    woken = timers_fire_due() + approvals_expire_due() + questions_expire_due()
    credits_reconcile()
    woken += credit_pools_reconcile()
    budget_holds_reconcile()
    runnable = [s.value for s in RUNNABLE]
    starts = [s.value for s in STARTS_TURN]
    with connection.cursor() as cursor:
        cursor.execute(
            # SQL names from model metadata (constants); every value is a bound parameter.
            # A lease that lapsed with its owner still named is a run that died (or
            # stalled past its lease) mid-step: its successor checks the business rules
            # and the drift again before going on (`resume_check`). A run that stepped
            # aside gave its lease back (owner NULL) and is not a recovery, nor is a
            # decision's undo window that closed (UNDO_HOLD).
            f"""UPDATE {Session._meta.db_table}
                   SET lease_owner = NULL, lease_expires_at = now() + make_interval(secs => %s),
                       resume_check = resume_check OR (lease_owner IS NOT NULL AND lease_owner <> %s)
                 WHERE (state = ANY(%s) OR (state = ANY(%s) AND queued_count > 0))
                   AND (lease_expires_at IS NULL OR lease_expires_at < now())
             RETURNING id, value""",  # nosec B608
            [settings.SESSION_PICKUP_GRACE_S, UNDO_HOLD, runnable, starts],
        )
        # Highest value first: with a worker free, the first sent is the first taken.
        found = sorted(cursor.fetchall(), key=lambda row: -row[1])
    ids = [str(session_id) for session_id, _ in found]
    for session_id, value in found:
        dispatch.run_enqueue(session_id, value)
    # One INFO line when the sweeper acts; a sweep that finds nothing is silent
    # (it runs every SWEEPER_INTERVAL_S).
    if ids or woken:
        logger.info(
            "sweeper: requeued %d session(s) %s, woke %d timer(s) %s",
            len(ids),
            ids,
            len(woken),
            woken,
        )
    steps_pace()
    try:
        sweep_mark_completed()
    except redis.RedisError as exc:
        # /readyz turns unready when no completion is recorded; the sweep itself did its work.
        logger.warning("sweeper: could not record the completed sweep: %s", type(exc).__name__)
    return woken + ids


def steps_pace() -> health.Pacing:
    """Measure the database round trip and read the workers' recent model latency;
    publish the pause runs make between steps (runtime/health.py). The published
    value lapses a few sweeps after the sweeper stops, so no stale pacing lingers."""
    started = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()
    db_rtt_ms = (time.perf_counter() - started) * 1000
    try:
        reports = health.reports_read()
    except (redis.RedisError, ValueError, TypeError, KeyError):
        reports = []
    pacing = health.pacing_compute(
        db_rtt_ms=db_rtt_ms,
        model_p95_s=max((r.model_p95_s for r in reports), default=0.0),
        db_slow_ms=settings.PACING_DB_SLOW_MS,
        model_slow_s=settings.PACING_MODEL_SLOW_S,
        max_delay_s=settings.PACING_MAX_DELAY_S,
    )
    if pacing.delay_s:
        logger.info(
            "sweeper: pacing steps by %.2f s (%s)", pacing.delay_s, "; ".join(pacing.reasons)
        )
    try:
        health.pacing_publish(pacing, ttl_s=max(settings.SWEEPER_INTERVAL_S * 5, 5.0))
    except redis.RedisError as exc:
        logger.warning("sweeper: could not publish the step pacing: %s", type(exc).__name__)
    return pacing


def credits_reconcile(*, older_than_s: float | None = None) -> int:
    """Close reservations a crash or an ended turn left open, from their calls' final status.

    A call still executing is in flight (or its run will be taken over): left
    alone. One that succeeded is settled; one that failed, was rejected or
    whose session is gone is released.
    """
    older = settings.SESSION_LEASE_S * 2 if older_than_s is None else older_than_s
    keys = reservations_open(older_than_s=older)
    waiting_expire()
    if not keys:
        return 0
    statuses = dict(
        ToolCall.objects.filter(idempotency_key__in=keys).values_list("idempotency_key", "status")
    )
    settle = [k for k in keys if statuses.get(k) == ToolCallStatus.SUCCESS]
    release = [
        k for k in keys if statuses.get(k) not in (ToolCallStatus.SUCCESS, ToolCallStatus.EXECUTING)
    ]
    credits_close(keys=settle, settle=True, actor="sweeper")
    credits_close(keys=release, settle=False, actor="sweeper")
    if settle or release:
        logger.info(
            "sweeper: settled %d and released %d orphaned reservation(s)", len(settle), len(release)
        )
    return len(settle) + len(release)


def credit_pools_reconcile() -> list[str]:
    """Give back pool points a turn that ended (a cancel, a crash) still holds, drop the
    waiting requests of turns that moved on, then grant what fits of each queue and wake the
    parked runs granted (a wake-up lost with a worker, or points given back here)."""
    closed = pool_requests_close(
        session_table=Session._meta.db_table,
        parked=State.WAITING_CREDITS.value,
        holding=[State.TOOL_WAIT.value],
    )
    if closed:
        logger.info("sweeper: closed %d credit pool request(s) of ended turns", closed)
    return pool_wake()


def budget_holds_reconcile(*, lease_grace_s: float | None = None) -> int:
    """Give back the budget holds of model calls whose run died: its session's lease lapsed
    or passed to another run (which holds again for itself) `lease_grace_s` ago, or the hold
    is past BUDGET_HOLD_S. Their calls' cost, if any was recorded, is in the rollups."""
    grace = settings.SESSION_LEASE_S * 2 if lease_grace_s is None else lease_grace_s
    released = budget_holds_sweep(session_table=Session._meta.db_table, lease_grace_s=grace)
    if released:
        logger.info("sweeper: released %d budget hold(s) of runs that died", released)
    return released


def timers_fire_due(*, limit: int = 100) -> list[str]:
    """Wake sessions whose follow-up is due (the due time lives in the row, not in the broker)."""
    woken: list[str] = []
    due = Session.objects.filter(
        state=State.WAITING_TIMER.value, timer_due_at__lte=timezone.now()
    ).order_by("timer_due_at")[:limit]
    for session in due:
        try:
            with transaction.atomic():
                timer_fire(session=session)
                dispatch.run_enqueue_on_commit(session.pk, session.value)
            woken.append(str(session.pk))
        except (StaleSession, IllegalTransition):
            continue  # another sweeper (or a cancel) got there first
    return woken


def questions_expire_due(*, limit: int = 100) -> list[str]:
    """Answer overdue `ask_user` questions with their default answer (the system answers);
    end the turns whose client did not send its own tools' results in time (`expired`)."""
    woken: list[str] = []
    due = Session.objects.filter(
        state=State.PAUSED_FOR_USER.value, timer_due_at__lte=timezone.now()
    ).order_by("timer_due_at")[:limit]
    for session in due:
        with transaction.atomic():
            locked = (
                Session.objects.locked()
                .filter(pk=session.pk, state=State.PAUSED_FOR_USER.value)
                .first()
            )
            question = open_question(locked) if locked is not None else None
            waiting = open_client_calls(locked) if locked is not None and question is None else []
            if locked is not None and waiting:
                # Nobody listens for the answer: no worker, no model call.
                client_calls_expire(session=locked, actor=SYSTEM_ACTOR)
                woken.append(str(session.pk))
                continue
            if locked is None or question is None:
                continue  # answered (or cancelled) meanwhile
            default = (
                question.input.get("default_answer") if isinstance(question.input, dict) else None
            )
            answer = (
                str(default)
                if default
                else "(the user did not answer before the deadline; no default answer was given)"
            )
            user_answer(session=locked, call=question, answer=answer, by=SYSTEM_ACTOR)
            dispatch.run_enqueue_on_commit(locked.pk, locked.value)
        woken.append(str(session.pk))
    return woken


def checkpoints_prune(*, older_than_days: float | None = None, batch: int = 5000) -> int:
    """Delete checkpoints of finished turns older than the retention age, keeping each session's latest.

    History and events are kept; only the step snapshots go. Deletes in
    batches so no transaction runs long.
    """
    days = settings.CHECKPOINT_RETENTION_DAYS if older_than_days is None else older_than_days
    cutoff = timezone.now() - timedelta(days=days)
    ended = [s.value for s in STARTS_TURN]
    total = 0
    while True:
        with connection.cursor() as cursor:
            cursor.execute(
                # SQL names from model metadata (constants); every value is a bound parameter.
                f"""DELETE FROM {Checkpoint._meta.db_table} WHERE id IN (
                        SELECT c.id FROM {Checkpoint._meta.db_table} c
                          JOIN {Session._meta.db_table} s ON s.id = c.session_id
                         WHERE c.created_at < %s
                           AND (c.turn < s.turn OR s.state = ANY(%s))
                           AND c.step < s.step
                         LIMIT %s)""",  # nosec B608
                [cutoff, ended, batch],
            )
            deleted = cursor.rowcount
        total += deleted
        if deleted < batch:
            return total


def ephemeral_sessions_prune(*, older_than_s: float | None = None, batch: int = 200) -> int:
    """Delete ephemeral sessions (stateless OpenAI-compatible requests) idle for longer than
    `EPHEMERAL_SESSION_TTL_S`, with everything they hold; a session whose turn still runs or
    waits (for a person, an answer, a timer) is kept. In batches: no transaction runs long."""
    ttl = settings.EPHEMERAL_SESSION_TTL_S if older_than_s is None else older_than_s
    cutoff = timezone.now() - timedelta(seconds=ttl)
    at_rest = [State.IDLE.value, *(s.value for s in TURN_ENDED)]
    deleted = 0
    while True:
        ids = list(
            Session.objects.filter(ephemeral=True, updated_at__lt=cutoff, state__in=at_rest)
            .order_by("updated_at")
            .values_list("pk", flat=True)[:batch]
        )
        if not ids:
            return deleted
        with transaction.atomic():
            # Checked again: a message may have woken one since it was read.
            _, by_model = Session.objects.filter(
                pk__in=ids, updated_at__lt=cutoff, state__in=at_rest
            ).delete()
        deleted += by_model.get(Session._meta.label, 0)
