"""What is committed before a tool call is sent, so a crash cannot repeat its side effect:
the recovery checkpoint of a level 2 or 3 call (runtime-mechanisms 3.3: what recovering or
compensating it needs; its level is the risk gate's, engine/gates/risk.py), then the mark
that each side-effecting call is about to go out (`calls_dispatched`); and, for a retry
whose wait is too long to sleep in the worker, when each call may go again
(`calls_retry_later`).
"""

from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from engine.gates.risk import CHECKPOINT_LEVEL, probe_of
from engine.moves.turn import build_step, metered_commit
from engine.store.commit import StaleSession
from record.models import Session, ToolCall, ToolCallStatus
from tools.execution import ToolSnapshot


def pre_run_checkpoint(
    session: Session, owner: str, calls: list[ToolCall], tools: dict[str, ToolSnapshot]
) -> None:
    """Before level 2+ calls are sent, commit what recovering or compensating them needs."""
    risky = [
        c
        for c in calls
        if (c.risk_level or 0) >= CHECKPOINT_LEVEL
        and c.tool_name in tools
        and c.status == ToolCallStatus.EXECUTING
    ]
    if not risky:
        return
    with transaction.atomic():
        metered_commit(
            build_step(
                session,
                owner,
                trigger=None,
                phase="pre_run",
                reason="checkpoint before " + ", ".join(c.tool_name for c in risky),
                checkpoint={
                    "pre_run": [
                        {
                            "call_id": c.call_id,
                            "tool": c.tool_name,
                            "risk_level": c.risk_level,
                            "why": c.risk_reason,
                            "arguments": c.input,
                            "idempotency_key": c.idempotency_key,
                            "idempotent": tools[c.tool_name].idempotent,
                            "probe": probe_of(tools[c.tool_name]),
                            "env_fingerprint": session.env_fingerprint,
                        }
                        for c in risky
                    ]
                },
            )
        )


# SQL names from model metadata (constants); every value is a bound parameter.
_MARK_DISPATCHED = f"""UPDATE "{ToolCall._meta.db_table}" c SET dispatched_at = %s
     WHERE c.id = ANY(%s::bigint[]) AND c.status = '{ToolCallStatus.EXECUTING.value}'
       AND EXISTS (SELECT 1 FROM "{Session._meta.db_table}" s
                    WHERE s.id = c.session_id AND s.id = %s AND s.lease_owner = %s
                      AND s.version = %s)"""  # nosec B608


def calls_dispatched(session: Session, owner: str, calls: list[ToolCall]) -> None:
    """Commit, before sending, that these side-effecting calls are about to go out.

    Only while this worker still holds the lease and the calls are still
    open: a worker that was paused past its lease (and replaced) must not send
    a side effect the replacement owns now; it raises StaleSession instead.
    """
    if calls:
        now = timezone.now()
        with connection.cursor() as cursor:
            # Plain SQL: the ORM spent ~0.4 ms building this joined UPDATE at every step.
            cursor.execute(
                _MARK_DISPATCHED, [now, [c.pk for c in calls], session.pk, owner, session.version]
            )
            claimed = cursor.rowcount
        if claimed != len(calls):
            raise StaleSession(
                f"session {session.pk} was taken over before its tool calls were sent"
            )
        for call in calls:
            call.dispatched_at = now


_RETRY_LATER = f"""UPDATE "{ToolCall._meta.db_table}" c
       SET attempts = c.attempts + v.tried,
           retry_at = now() + make_interval(secs => v.wait),
           dispatched_at = NULL
      FROM unnest(%s::bigint[], %s::int[], %s::float8[]) AS v(id, tried, wait)
     WHERE c.id = v.id AND c.status = '{ToolCallStatus.EXECUTING.value}'
       AND EXISTS (SELECT 1 FROM "{Session._meta.db_table}" s
                    WHERE s.id = c.session_id AND s.id = %s AND s.lease_owner = %s
                      AND s.version = %s)"""  # nosec B608


def calls_retry_later(
    session: Session, owner: str, retries: list[tuple[ToolCall, int, float]]
) -> None:
    """Commit that these calls go again after their wait: (call, attempts made now, wait s).

    The attempts add up across steps (the policy counts them all); a side-effecting
    call is only here when its error proved it did not take effect, so its dispatched
    mark goes (it is sent again as new, with the same idempotency key, never probed).
    Only while this worker holds the lease and the calls are open (else StaleSession).
    """
    if not retries:
        return
    with connection.cursor() as cursor:
        cursor.execute(
            _RETRY_LATER,
            [
                [c.pk for c, _, _ in retries],
                [tried for _, tried, _ in retries],
                [wait for _, _, wait in retries],
                session.pk,
                owner,
                session.version,
            ],
        )
        claimed = cursor.rowcount
    if claimed != len(retries):
        raise StaleSession(f"session {session.pk} was taken over before its retries were set")


def calls_probed(probed: list[tuple[ToolCall, bool]]) -> None:
    """Record each probe's verdict on its call (engine/gates/recovery.py), and count the
    probes that could not tell (F(): a count never lost to a concurrent reader)."""
    for call, unsure in probed:
        updates: dict[str, object] = {"probe_outcome": call.probe_outcome}
        if unsure:
            updates["probes"] = F("probes") + 1
        ToolCall.objects.filter(pk=call.pk).update(**updates)
