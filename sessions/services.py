"""What the edges call: create sessions, post messages, cancel, sweep.

Each function is keyword-only, runs in one short transaction and leaves the
long work (model and tool calls) to a worker, woken after commit.
"""

import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from uuid import UUID

import redis
from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from approvals.models import Approval
from approvals.selectors import approval_get, approval_pending_exists, approvals_due
from approvals.services import (
    SYSTEM_ACTOR,
    approval_arguments_check,
    approval_resolve,
    approvals_cancel,
)
from approvals.states import Outcome
from billing.selectors import reservations_open
from billing.services import credits_close, waiting_expire
from memory.tokens import count_message_tokens
from runtime.cancellation import cancel_signal
from tools.execution import tools_for_agent

from .dispatch import run_enqueue, run_enqueue_on_commit
from .engine import (
    INTERRUPT_REASON,
    RunResult,
    StaleSession,
    approval_recorded,
    fork_start,
    run_resume,
    session_run,
    timer_fire,
    turn_cancel,
    turn_start,
)
from .errors import Conflict, Forbidden, InvalidInput, NotFound, PayloadTooLarge
from .models import (
    Agent,
    Checkpoint,
    DoubleTexting,
    Message,
    MessageStatus,
    Session,
    ToolCall,
    ToolCallStatus,
)
from .states import RUNNABLE, STARTS_TURN, TURN_ENDED, IllegalTransition, State
from .sweep_status import sweep_mark_completed

logger = logging.getLogger(__name__)


def session_create(
    *,
    owner: User,
    agent_slug: str,
    key_roles: list[str],
    role: str | None = None,
    metadata: dict[str, Any] | None = None,
    value: float | None = None,
) -> Session:
    """Open a session on an agent; its role is fixed now from what the caller's key allows,
    its value (priority for credits) from the caller or else the agent."""
    agent = Agent.objects.filter(slug=agent_slug, enabled=True).first()
    if agent is None:
        raise InvalidInput(
            f"unknown agent '{agent_slug}'", details={"field": "agent"}, code="unknown_agent"
        )
    if role:
        if role not in key_roles:
            raise InvalidInput(
                f"role '{role}' is not granted to this API key (granted: {', '.join(key_roles) or 'none'})",
                details={"field": "role"},
            )
    else:
        role = key_roles[0] if key_roles else ""
    return Session.objects.create(
        agent=agent,
        owner=owner,
        role=role,
        metadata=metadata or {},
        value=agent.value if value is None else value,
    )


@dataclass(frozen=True)
class PostedMessage:
    message: Message
    created: bool


def message_post(
    *, session: Session, content: str, idempotency_key: str | None = None
) -> PostedMessage:
    """Accept a user message durably, then start its turn or deal with the running one.

    1. Lock the session row for the length of this short transaction, so
       posts into one session are serialised in arrival order.
    2. A repeated idempotency key returns the first message (409 if the body differs).
    3. While a turn runs, the agent's double-texting policy decides: `enqueue`
       (wait for the turn, in order), `interrupt` (stop the turn at its next
       step boundary, then run this one) or `reject` (409).
    4. Store the message as queued; if no turn is running, start one now.
    5. After commit, wake a worker (and, on interrupt, close a running stream).
    """
    if not content or not content.strip():
        raise InvalidInput("content must be a non-empty string", details={"field": "content"})
    if len(content) > settings.MAX_MESSAGE_CHARS:
        raise PayloadTooLarge(
            f"content has {len(content)} characters; the limit is {settings.MAX_MESSAGE_CHARS}",
            details={"field": "content", "limit": settings.MAX_MESSAGE_CHARS},
        )
    with transaction.atomic():
        # Only the session row: posts to other sessions of the agent and an
        # admin edit of the agent must not wait for this one.
        locked = (
            Session.objects.select_for_update(of=("self",), no_key=True)
            .select_related("agent")
            .get(pk=session.pk)
        )
        if idempotency_key:
            existing = Message.objects.filter(
                session=locked, idempotency_key=idempotency_key
            ).first()
            if existing is not None:
                if existing.content != content:
                    raise Conflict(
                        "idempotency_key was already used with a different content",
                        details={"idempotency_key": idempotency_key},
                        code="idempotency_conflict",
                    )
                return PostedMessage(message=existing, created=False)
        state = State(locked.state)
        busy = state not in STARTS_TURN
        policy = locked.agent.double_texting
        if busy and policy == DoubleTexting.REJECT:
            raise Conflict(
                "a turn is still running and this agent does not accept messages until it finishes",
                details={"state": state.value, "policy": policy},
                code="turn_in_progress",
            )
        message = Message(
            session=locked,
            role="user",
            content=content,
            idempotency_key=idempotency_key or None,
            token_count=count_message_tokens(content),
        )
        if not busy and locked.queued_count == 0:
            # The common case: straight into the history, in the turn-start step itself.
            message.status = MessageStatus.FINAL
            turn_start(session=locked, lease_owner=None, message=message)
        else:
            # The row lock serialises posts and the key was checked above, so
            # the insert cannot conflict.
            message.status = MessageStatus.QUEUED
            message.save(force_insert=True)
            Session.objects.filter(pk=locked.pk).update(queued_count=F("queued_count") + 1)
            locked.queued_count += 1
            if not busy:
                turn_start(session=locked, lease_owner=None)
            elif policy == DoubleTexting.INTERRUPT:
                _turn_interrupt(locked, reason=INTERRUPT_REASON, actor="")
                if State(locked.state) in STARTS_TURN:
                    turn_start(session=locked, lease_owner=None)
        run_enqueue_on_commit(locked.pk, locked.value)
    return PostedMessage(message=message, created=True)


def _turn_interrupt(locked: Session, *, reason: str, actor: str) -> bool:
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
    *, session: Session, reason: str = "cancelled by the client", actor: str = ""
) -> bool:
    """Interrupt the current turn; False if there was nothing to interrupt.

    A running tool finishes and its result is recorded; a streaming model
    call is closed; no further step starts; the turn ends `cancelled` with
    the reason and who asked.
    """
    with transaction.atomic():
        locked = Session.objects.select_for_update(of=("self",), no_key=True).get(pk=session.pk)
        interrupted = _turn_interrupt(locked, reason=reason, actor=actor)
        if interrupted and State(locked.state) in RUNNABLE:
            # If no worker holds the session, the woken run finishes the cancel.
            run_enqueue_on_commit(locked.pk, locked.value)
        return interrupted


def session_run_pending(*, session_id: UUID | str) -> RunResult:
    """The worker's entry point: run whatever the session has to do."""
    return session_run(session_id=session_id)


def sessions_sweep() -> list[str]:
    """Requeue runs whose lease ran out and queued turns nobody runs; wake due timers.

    Claiming a session here pushes its lease expiry one pickup grace ahead, so
    a sweep every half second does not enqueue the same session each time.
    """
    woken = timers_fire_due() + approvals_expire_due()
    credits_reconcile()
    runnable = [s.value for s in RUNNABLE]
    starts = [s.value for s in STARTS_TURN]
    with connection.cursor() as cursor:
        cursor.execute(
            f"""UPDATE {Session._meta.db_table}
                   SET lease_owner = NULL, lease_expires_at = now() + make_interval(secs => %s)
                 WHERE (state = ANY(%s) OR (state = ANY(%s) AND queued_count > 0))
                   AND (lease_expires_at IS NULL OR lease_expires_at < now())
             RETURNING id, value""",
            [settings.SESSION_PICKUP_GRACE_S, runnable, starts],
        )
        # Highest value first: with a worker free, the first sent is the first taken.
        found = sorted(cursor.fetchall(), key=lambda row: -row[1])
    ids = [str(session_id) for session_id, _ in found]
    for session_id, value in found:
        run_enqueue(session_id, value)
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
    try:
        sweep_mark_completed()
    except redis.RedisError as exc:
        # /readyz turns unready when no completion is recorded; the sweep itself did its work.
        logger.warning("sweeper: could not record the completed sweep: %s", type(exc).__name__)
    return woken + ids


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
                run_enqueue_on_commit(session.pk, session.value)
            woken.append(str(session.pk))
        except (StaleSession, IllegalTransition):
            continue  # another sweeper (or a cancel) got there first
    return woken


def _approval_apply(
    *,
    approval: Approval,
    outcome: Outcome,
    actor: str,
    user: User | None = None,
    comment: str = "",
    edited_arguments: dict[str, Any] | None = None,
    remember: bool = False,
    escalate_to: str = "",
    deadline: Any = None,
) -> Approval | None:
    """Resolve one approval and record it on its session, in one short transaction.

    The session row is locked first (decisions on one session's approvals
    queue behind each other), then the approval moves by a conditional
    UPDATE: of two racing deciders exactly one gets a row back. When the
    step has nothing pending any more, the session goes back to `tool_wait`
    and a worker is woken after commit.
    """
    with transaction.atomic():
        locked = Session.objects.select_for_update(of=("self",), no_key=True).get(
            pk=approval.session_id
        )
        resolved = approval_resolve(
            approval=approval,
            outcome=outcome,
            actor=actor,
            user=user,
            comment=comment,
            edited_arguments=edited_arguments,
            remember=remember,
            escalate_to=escalate_to,
            deadline=deadline,
        )
        if resolved is None:
            return None
        if State(locked.state) == State.AWAITING_APPROVAL:
            resume = not approval_pending_exists(session_id=locked.pk)
            approval_recorded(
                session=locked, approval=resolved, outcome=outcome, by=actor, resume=resume
            )
            if resume:
                run_enqueue_on_commit(locked.pk, locked.value)
    return resolved


def approval_decide(
    *,
    approval_id: UUID | str,
    approve: bool,
    user: User,
    groups: list[str],
    comment: str = "",
    arguments: dict[str, Any] | None = None,
    remember: bool = False,
) -> Approval:
    """An approver's decision: approve (maybe with edited arguments), or reject with a comment.

    403 if the approval is not for one of the approver's groups, 400 if edited
    arguments fail the tool's schema, 409 `approval_resolved` if it is no longer
    pending (another approver or the deadline was first).
    """
    approval = approval_get(approval_id=approval_id)
    if approval is None:
        raise NotFound(f"approval {approval_id} not found")
    if approval.group not in groups:
        raise Forbidden(
            f"this approval is for the group '{approval.group}'; you approve for {', '.join(groups)}",
            details={"group": approval.group},
        )
    if approval.status != "pending":
        raise _resolved_conflict(approval)
    edited = None
    if approve and arguments is not None:
        tool = tools_for_agent([approval.tool_name]).get(approval.tool_name)
        edited = approval_arguments_check(approval=approval, tool=tool, arguments=arguments)
    resolved = _approval_apply(
        approval=approval,
        outcome=Outcome.APPROVED if approve else Outcome.REJECTED,
        actor=user.get_username(),
        user=user,
        comment=comment,
        edited_arguments=edited,
        remember=remember and approve,
    )
    if resolved is None:
        fresh = approval_get(approval_id=approval.pk)
        raise _resolved_conflict(fresh or approval)
    return resolved


def _resolved_conflict(approval: Approval) -> Conflict:
    return Conflict(
        f"approval {approval.pk} is already {approval.status}",
        details={"status": approval.status, "decided_by": approval.decided_by_name},
        code="approval_resolved",
    )


def approvals_expire_due(*, limit: int = 100) -> list[str]:
    """Apply each overdue approval's default policy, with the system as the actor.

    `reject` (expired), `approve`, or `escalate` once to the tool's other
    group with a fresh deadline (a second deadline then expires it). A
    decision that lands first wins; this then changes nothing.
    """
    done: list[str] = []
    for approval in approvals_due(limit=limit):
        policy = approval.on_timeout
        if policy == "approve":
            outcome, comment = Outcome.APPROVED, "approved by the deadline policy"
        elif policy == "escalate" and approval.escalate_to and approval.escalations == 0:
            outcome, comment = Outcome.ESCALATED, f"escalated to {approval.escalate_to}"
        else:
            outcome, comment = Outcome.EXPIRED, "no decision before the deadline"
        resolved = _approval_apply(
            approval=approval,
            outcome=outcome,
            actor=SYSTEM_ACTOR,
            comment=comment,
            escalate_to=approval.escalate_to,
            deadline=timezone.now() + timedelta(seconds=approval.timeout_s)
            if outcome == Outcome.ESCALATED
            else None,
        )
        if resolved is not None:
            done.append(str(approval.pk))
    return done


def session_resume(*, session: Session, actor: str = "") -> Session:
    """Continue a run that stopped in `error`, from where it stopped."""
    with transaction.atomic():
        locked = Session.objects.select_for_update(of=("self",), no_key=True).get(pk=session.pk)
        if State(locked.state) != State.ERROR:
            raise Conflict(
                f"only a session in error can be resumed; this one is {locked.state}",
                code="not_resumable",
            )
        run_resume(session=locked, actor=actor)
        run_enqueue_on_commit(locked.pk, locked.value)
    return locked


def session_fork(
    *, session: Session, step: int, owner: User | None = None, actor: str = ""
) -> Session:
    """A new session from checkpoint `step` of this one; the original is untouched.

    1. Copy the history the checkpoint covers (messages up to its `message_seq`),
       dropping a trailing tool request whose results lie beyond it.
    2. If the copy ends with the user or a tool result, the model decides next
       (-> tool_loop) and a worker is woken; otherwise it waits for the user.
    3. The next model step compares the environment recorded at the fork with
       today's and tells the model what changed.
    """
    checkpoint = Checkpoint.objects.filter(session=session, step=step).first()
    if checkpoint is None:
        raise NotFound(
            f"session {session.pk} has no checkpoint {step}", details={"field": "checkpoint"}
        )
    recorded_env = (
        Checkpoint.objects.filter(session=session, step__lte=step, context__has_key="env")
        .order_by("-step")
        .values_list("context", flat=True)
        .first()
    )
    with transaction.atomic():
        history = list(
            Message.objects.filter(
                session=session, status=MessageStatus.FINAL, seq__lte=checkpoint.message_seq
            ).order_by("seq")
        )
        while history and history[-1].role == "assistant" and history[-1].tool_calls:
            history.pop()
        fork = Session.objects.create(
            agent=session.agent,
            owner=owner or session.owner,
            role=session.role,
            metadata={**session.metadata, "forked_from": str(session.pk), "forked_at_step": step},
            forked_from=session,
            forked_at_step=step,
            turn=checkpoint.turn,
            message_seq=len(history),
            resume_check=True,
        )
        Message.objects.bulk_create(
            [
                Message(
                    session=fork,
                    seq=i,
                    turn=m.turn,
                    role=m.role,
                    status=MessageStatus.FINAL,
                    content=m.content,
                    tool_calls=m.tool_calls,
                    tool_call_id=m.tool_call_id,
                    name=m.name,
                    data=m.data,
                    token_count=m.token_count,
                )
                for i, m in enumerate(history, start=1)
            ]
        )
        decide = bool(history) and history[-1].role in ("user", "tool", "system")
        fork_start(
            fork=fork,
            source=session,
            at_step=step,
            message_seq=len(history),
            env=recorded_env["env"] if recorded_env else None,
            decide=decide,
            actor=actor,
        )
        if decide:
            run_enqueue_on_commit(fork.pk, fork.value)
    return fork


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
                f"""DELETE FROM {Checkpoint._meta.db_table} WHERE id IN (
                        SELECT c.id FROM {Checkpoint._meta.db_table} c
                          JOIN {Session._meta.db_table} s ON s.id = c.session_id
                         WHERE c.created_at < %s
                           AND (c.turn < s.turn OR s.state = ANY(%s))
                           AND c.step < s.step
                         LIMIT %s)""",
                [cutoff, ended, batch],
            )
            deleted = cursor.rowcount
        total += deleted
        if deleted < batch:
            return total


def session_get(*, session_id: UUID | str) -> Session:
    try:
        return Session.objects.select_related("agent").get(pk=session_id)
    except (Session.DoesNotExist, ValueError, ValidationError):
        # A malformed id (Django raises ValidationError for it) is just as missing.
        raise NotFound(f"session {session_id} not found") from None
