"""Runs: interrupting and cancelling a turn, running what is pending, resuming a stopped
run, keeping what a turn taught the memory.
"""

import logging
from collections.abc import Sequence
from uuid import UUID

from django.conf import settings
from django.db import connection, transaction

from approvals.services import (
    SYSTEM_ACTOR,
    approvals_cancel,
)
from audit.models import AuditAction
from engine import (
    RunResult,
    run_resume,
    session_run,
    summary_ahead_make,
    turn_cancel,
    turn_memory_keep,
)
from record import dispatch
from record.errors import Conflict
from record.models import (
    Session,
)
from record.states import RUNNABLE, TURN_ENDED, State
from runtime import health
from runtime.cancellation import cancel_signal
from sessions.services.grants import session_role_check
from sessions.services.trail import session_audit

logger = logging.getLogger(__name__)


def turn_interrupt(locked: Session, *, reason: str, actor: str) -> bool:
    """Stop the locked session's current turn; False if none runs.

    A running turn gets the durable flag (checked at every step boundary) and
    a signal that closes a model stream in flight; a turn waiting on a person
    or a clock has no worker, so it is cancelled right here.
    """
    state = State(locked.state)
    if state in RUNNABLE:
        Session.objects.filter(pk=locked.pk).update(
            cancel_requested=True, cancel_reason=reason[:200], cancel_actor=actor[:150]
        )
        locked.cancel_requested, locked.cancel_reason, locked.cancel_actor = (
            True,
            reason[:200],
            actor[:150],
        )
        session_id = locked.pk
        transaction.on_commit(lambda: cancel_signal(session_id))
        return True
    if state in TURN_ENDED:
        return False
    if state == State.AWAITING_APPROVAL:
        # None of its gated calls may run once the turn is over.
        approvals_cancel(session_id=locked.pk, actor=actor or SYSTEM_ACTOR, reason=reason)
    turn_cancel(session=locked, reason=reason, actor=actor)
    return True


def session_cancel(
    *,
    session: Session,
    reason: str = "cancelled by the client",
    actor: str = "",
    key_prefix: str = "",
    audited: bool = True,
) -> bool:
    """Interrupt the current turn; False if there was nothing to interrupt.

    A running tool finishes and its result is recorded; a streaming model
    call is closed; no further step starts; the turn ends `cancelled` with
    the reason and who asked. A cancel that interrupted something is in the audit
    trail (its children's cascade is not: it follows from this one).
    """
    with transaction.atomic():
        locked = Session.objects.locked().get(pk=session.pk)
        state = locked.state
        interrupted = turn_interrupt(locked, reason=reason, actor=actor)
        if interrupted and audited:
            session_audit(
                action=AuditAction.SESSION_CANCEL,
                session=locked,
                actor=actor,
                key_prefix=key_prefix,
                reason=reason,
                data={"from_state": state},
            )
        if interrupted and State(locked.state) in RUNNABLE:
            # If no worker holds the session, the woken run finishes the cancel.
            dispatch.run_enqueue_on_commit(locked.pk, locked.value)
    # Its children's runs serve only this one: they stop too (and theirs, in turn).
    for child in Session.objects.filter(parent=session).exclude(
        state__in=[s.value for s in TURN_ENDED]
    ):
        session_cancel(
            session=child,
            reason=f"its parent was cancelled: {reason}",
            actor=actor,
            audited=False,
        )
    return interrupted


def session_run_pending(*, session_id: UUID | str) -> RunResult:
    """The worker's entry point: run whatever the session has to do.

    A worker over its health thresholds takes no new runs (runtime/health.py): a run
    it had already prefetched goes back to the queue a little later, for another
    worker or for this one once it recovered. Nothing is lost if that send fails:
    the session row is still runnable and the sweeper requeues it.
    """
    if not health.accepting():
        value = Session.objects.filter(pk=session_id).values_list("value", flat=True).first()
        dispatch.run_enqueue_later(session_id, settings.WORKER_REQUEUE_DELAY_S, value)
        connection.close()
        return RunResult(0, "requeued")
    return session_run(session_id=session_id)


def session_resume(
    *,
    session: Session,
    actor: str = "",
    key_roles: Sequence[str] | None = None,
    key_prefix: str = "",
) -> Session:
    """Continue a run that stopped in `error`, from where it stopped. A key's request
    (`key_roles` given) needs the session's role; an operator's (None) does not."""
    with transaction.atomic():
        locked = Session.objects.locked().get(pk=session.pk)
        if key_roles is not None:
            session_role_check(role=locked.role, key_roles=key_roles)
        if State(locked.state) != State.ERROR:
            raise Conflict(
                f"only a session in error can be resumed; this one is {locked.state}",
                code="not_resumable",
            )
        error = locked.last_error
        run_resume(session=locked, actor=actor)
        session_audit(
            action=AuditAction.SESSION_RESUME,
            session=locked,
            actor=actor,
            key_prefix=key_prefix,
            data={"error": error[:200]},
        )
        dispatch.run_enqueue_on_commit(locked.pk, locked.value)
    return locked


def summary_ahead_run(*, session_id: UUID | str) -> bool:
    """After a step past the ahead watermark: make the session's next summary, ready for
    the step that needs it (engine/phases/after_turn.py)."""
    return summary_ahead_make(session_id=str(session_id))


def memory_turn_keep(*, session_id: UUID | str, turn: int) -> int:
    """After a turn: store what the user asked to remember and what extraction found."""
    return turn_memory_keep(session_id=str(session_id), turn=turn)
