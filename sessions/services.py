"""What the edges call: create sessions, post messages, cancel, sweep.

Each function is keyword-only, runs in one short transaction and leaves the
long work (model and tool calls) to a worker, woken after commit.
"""

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from uuid import UUID

import redis
from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.db.models import F, QuerySet
from django.utils import timezone

from approvals.models import Approval, ApprovalKind, ReviewAnswer
from approvals.policy import four_eyes_forbids
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
from engine import (
    INTERRUPT_REASON,
    RunResult,
    StaleSession,
    approval_recorded,
    fork_start,
    hand_back,
    open_question,
    operator_finish,
    operator_reply,
    operator_tool_intent,
    operator_tool_result,
    run_resume,
    session_run,
    summary_through,
    timer_fire,
    turn_cancel,
    turn_memory_keep,
    turn_start,
    user_answer,
)
from memory.tokens import count_message_tokens
from runtime import health, io_loop
from runtime.cancellation import cancel_signal
from runtime.fastpaths.prepared import PreparedQuery
from tools.execution import ToolInvocation, execute_all, tools_for_agent

from .dispatch import run_enqueue, run_enqueue_later, run_enqueue_on_commit
from .errors import Conflict, Forbidden, InvalidInput, NotFound, PayloadTooLarge
from .json_limits import JsonRejected, json_check
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
from .selectors import session_id_parse
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
    value_max: float | None = None,
) -> Session:
    """Open a session on an agent; its role is fixed now from what the caller's key allows,
    its value (priority for credits and workers) from the caller, within what the key is
    granted (`value_max`, see `session_value_check`), or else the agent's."""
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
    if value is not None:
        session_value_check(value=value, agent_value=agent.value, value_max=value_max)
    return Session.objects.create(
        agent=agent,
        owner=owner,
        role=role,
        metadata=metadata or {},
        value=agent.value if value is None else value,
    )


def session_value_check(*, value: float, agent_value: float, value_max: float | None) -> None:
    """A client may ask for a session value up to the agent's own value (what it gets anyway)
    or, above that, up to what an operator granted its key (`ApiKey.max_value`). The value
    orders the broker's queues and the claims on waiting credits, so a higher one is a
    privilege, not a preference (403 `value_not_allowed`, details: the maximum)."""
    limit = agent_value if value_max is None else max(agent_value, value_max)
    if value > limit:
        raise Forbidden(
            f"value {value:g} is above what this API key may set (at most {limit:g}); "
            "an operator grants more with the key's max_value",
            details={"field": "value", "max_value": limit},
            code="value_not_allowed",
        )


def session_role_check(*, role: str, key_roles: Sequence[str]) -> None:
    """A key acts on a session (posts a turn, answers its question, resumes or forks it)
    only if it holds the session's role: the role decides which tools the model may call,
    and the session's role is fixed when it opens, perhaps by another key of the same
    owner with more roles. An empty role (opened by a key without roles) is every key's."""
    if role and role not in key_roles:
        raise Forbidden(
            f"this API key does not hold the role '{role}' the session runs with "
            f"(the key holds: {', '.join(key_roles) or 'no role'})",
            details={"role": role, "key_roles": list(key_roles)},
            code="role_not_held",
        )


@dataclass(frozen=True)
class PostedMessage:
    message: Message
    created: bool


def message_post(
    *,
    session: Session,
    content: str,
    idempotency_key: str | None = None,
    extra_context: dict[str, Any] | None = None,
) -> PostedMessage:
    """Accept a user message durably, then start its turn or deal with the running one.

    1. Lock the session row for the length of this short transaction, so
       posts into one session are serialised in arrival order.
    2. A repeated idempotency key returns the first message (409 if the body differs).
    3. While a turn runs, the agent's double-texting policy decides: `enqueue`
       (wait for the turn, in order), `interrupt` (stop the turn at its next
       step boundary, then run this one) or `reject` (409).
    4. Store the message (with its `extra_context`, data for the model) as queued; if
       no turn is running, start one now.
    5. After commit, wake a worker (and, on interrupt, close a running stream).
    """
    _content_check(content)
    extra_context_check(extra_context)
    pk = session_id_parse(session.pk)
    with transaction.atomic():
        locked = None if pk is None else _session_locked.first(pk)
        if locked is None:
            raise Session.DoesNotExist(f"session {session.pk} is gone")
        return _message_accept(
            locked, content=content, idempotency_key=idempotency_key, extra_context=extra_context
        )


def message_post_for_owner(
    *,
    session_id: UUID | str,
    owner_id: int,
    key_roles: Sequence[str],
    content: str,
    idempotency_key: str | None = None,
    extra_context: dict[str, Any] | None = None,
) -> PostedMessage:
    """`message_post` for an API caller: the session is looked up and locked in one
    statement, and another owner's session is missing (NotFound), as in
    `selectors.session_get_for_owner`. A missing session is reported before
    anything wrong with the content, as when the two were checked apart; a key
    without the session's role (`session_role_check`) is refused before that."""
    pk = session_id_parse(session_id)
    with transaction.atomic():
        locked = None if pk is None else _session_of_owner_locked.first(pk, owner_id)
        if locked is None:
            raise NotFound(f"session {session_id} not found")
        session_role_check(role=locked.role, key_roles=key_roles)
        _content_check(content)
        extra_context_check(extra_context)
        return _message_accept(
            locked, content=content, idempotency_key=idempotency_key, extra_context=extra_context
        )


def _session_lock() -> QuerySet[Session]:
    # Only the session row: posts to other sessions of the agent and an
    # admin edit of the agent must not wait for this one.
    return Session.objects.select_for_update(of=("self",), no_key=True).select_related("agent")


# Every posted message (REST, websocket): compiled once (runtime/fastpaths/prepared.py).
_session_locked: PreparedQuery[Session] = PreparedQuery(
    lambda pk: _session_lock().filter(pk=pk), example=[UUID(int=0)]
)
_session_of_owner_locked: PreparedQuery[Session] = PreparedQuery(
    lambda pk, owner_id: _session_lock().filter(pk=pk, owner_id=owner_id),
    example=[UUID(int=0), 0],
)


def _content_check(content: str) -> None:
    if not content or not content.strip():
        raise InvalidInput("content must be a non-empty string", details={"field": "content"})
    if len(content) > settings.MAX_MESSAGE_CHARS:
        raise PayloadTooLarge(
            f"content has {len(content)} characters; the limit is {settings.MAX_MESSAGE_CHARS}",
            details={"field": "content", "limit": settings.MAX_MESSAGE_CHARS},
        )


def extra_context_check(extra_context: Any) -> None:
    """A message's `extra_context` is a JSON object within EXTRA_CONTEXT_MAX_DEPTH and
    EXTRA_CONTEXT_MAX_BYTES (as compact UTF-8 JSON), or absent (None)."""
    if extra_context is None:
        return
    if not isinstance(extra_context, dict):
        raise InvalidInput(
            f"extra_context must be a JSON object, not {_json_type(extra_context)}",
            details={"field": "extra_context"},
        )
    limit = settings.EXTRA_CONTEXT_MAX_BYTES
    try:
        json_check(
            extra_context,
            root="$.extra_context",
            max_depth=settings.EXTRA_CONTEXT_MAX_DEPTH,
            max_bytes=limit,
        )
    except JsonRejected as exc:
        if exc.too_large:  # too big is a 413, as for content and metadata
            raise PayloadTooLarge(
                f"extra_context: {exc.reason}", details={"field": "extra_context", "limit": limit}
            ) from None
        raise InvalidInput(
            f"extra_context: {exc.message}", details={"field": "extra_context", **exc.details}
        ) from None


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return type(value).__name__


def _message_accept(
    locked: Session,
    *,
    content: str,
    idempotency_key: str | None,
    extra_context: dict[str, Any] | None = None,
) -> PostedMessage:
    """message_post's steps 2-5, inside its transaction, with the session row locked."""
    if idempotency_key:
        existing = Message.objects.filter(session=locked, idempotency_key=idempotency_key).first()
        if existing is not None:
            if existing.content != content or existing.extra_context != extra_context:
                raise Conflict(
                    "idempotency_key was already used with a different content or extra_context",
                    details={"idempotency_key": idempotency_key},
                    code="idempotency_conflict",
                )
            return PostedMessage(message=existing, created=False)
    state = State(locked.state)
    question = open_question(locked) if state == State.PAUSED_FOR_USER else None
    if question is not None:
        # The answer to the model's ask_user: that call's result; the same turn goes on.
        answer = user_answer(
            session=locked, call=question, answer=content, by="user", extra_context=extra_context
        )
        if idempotency_key:
            Message.objects.filter(pk=answer.pk).update(idempotency_key=idempotency_key)
        run_enqueue_on_commit(locked.pk, locked.value)
        return PostedMessage(message=answer, created=True)
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
        extra_context=extra_context,
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
    """The worker's entry point: run whatever the session has to do.

    A worker over its health thresholds takes no new runs (runtime/health.py): a run
    it had already prefetched goes back to the queue a little later, for another
    worker or for this one once it recovered. Nothing is lost if that send fails:
    the session row is still runnable and the sweeper requeues it.
    """
    if not health.accepting():
        value = Session.objects.filter(pk=session_id).values_list("value", flat=True).first()
        run_enqueue_later(session_id, settings.WORKER_REQUEUE_DELAY_S, value)
        connection.close()
        return RunResult(0, "requeued")
    return session_run(session_id=session_id)


def sessions_sweep() -> list[str]:
    """Requeue runs whose lease ran out and queued turns nobody runs; wake due timers.

    Claiming a session here pushes its lease expiry one pickup grace ahead, so
    a sweep every half second does not enqueue the same session each time.
    """
    woken = timers_fire_due() + approvals_expire_due() + questions_expire_due()
    credits_reconcile()
    runnable = [s.value for s in RUNNABLE]
    starts = [s.value for s in STARTS_TURN]
    with connection.cursor() as cursor:
        cursor.execute(
            # SQL names from model metadata (constants); every value is a bound parameter.
            f"""UPDATE {Session._meta.db_table}
                   SET lease_owner = NULL, lease_expires_at = now() + make_interval(secs => %s)
                 WHERE (state = ANY(%s) OR (state = ANY(%s) AND queued_count > 0))
                   AND (lease_expires_at IS NULL OR lease_expires_at < now())
             RETURNING id, value""",  # nosec B608
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


def questions_expire_due(*, limit: int = 100) -> list[str]:
    """Answer overdue `ask_user` questions with their default answer (the system answers)."""
    woken: list[str] = []
    due = Session.objects.filter(
        state=State.PAUSED_FOR_USER.value, timer_due_at__lte=timezone.now()
    ).order_by("timer_due_at")[:limit]
    for session in due:
        with transaction.atomic():
            locked = (
                Session.objects.select_for_update(of=("self",), no_key=True)
                .filter(pk=session.pk, state=State.PAUSED_FOR_USER.value)
                .first()
            )
            question = open_question(locked) if locked is not None else None
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
            run_enqueue_on_commit(locked.pk, locked.value)
        woken.append(str(session.pk))
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
    answer: str = "",
    answer_result: Any = None,
    within_deadline: bool = False,
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
            answer=answer,
            answer_result=answer_result,
            within_deadline=within_deadline,
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

    403 if the approval is not for one of the approver's groups, 403 `four_eyes` if the
    approver owns the approval's session, 400 if edited arguments fail the tool's schema,
    409 `approval_resolved` if it is no longer pending (another approver or the deadline
    was first).
    """
    approval = approval_get(approval_id=approval_id)
    if approval is None:
        raise NotFound(f"approval {approval_id} not found")
    if approval.group not in groups:
        raise Forbidden(
            f"this approval is for the group '{approval.group}'; you approve for {', '.join(groups)}",
            details={"group": approval.group},
        )
    _four_eyes_check(approval=approval, user=user)
    if approval.status != "pending":
        raise _resolved_conflict(approval)
    if approval.kind == ApprovalKind.RECOVERY_REVIEW and approve:
        raise InvalidInput(
            "this is a recovery review: answer whether the call took effect "
            f"(POST .../review/ with answer {', '.join(ReviewAnswer.values)})",
            code="review_needs_answer",
        )
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
        within_deadline=True,
    )
    if resolved is None:
        fresh = approval_get(approval_id=approval.pk)
        raise _resolved_conflict(fresh or approval)
    return resolved


def review_answer(
    *,
    approval_id: UUID | str,
    answer: str,
    user: User,
    groups: list[str],
    result: Any = None,
    comment: str = "",
) -> Approval:
    """A person's answer to "did this uncertain call take effect?"; the run goes on.

    `took_effect` (with the call's `result`, what the model reads), `not_taken`
    (the model is told it did not happen; nothing is sent) or `send_again`
    (sent once more with the same idempotency key).
    """
    approval = approval_get(approval_id=approval_id)
    if approval is None or approval.kind != ApprovalKind.RECOVERY_REVIEW:
        raise NotFound(f"recovery review {approval_id} not found")
    if approval.group not in groups:
        raise Forbidden(
            f"this review is for the group '{approval.group}'; you approve for {', '.join(groups)}",
            details={"group": approval.group},
        )
    _four_eyes_check(approval=approval, user=user)
    if answer not in ReviewAnswer.values:
        raise InvalidInput(
            f"answer must be one of {', '.join(ReviewAnswer.values)}", details={"field": "answer"}
        )
    if answer != ReviewAnswer.TOOK_EFFECT and result is not None:
        raise InvalidInput("a result goes only with took_effect", details={"field": "result"})
    if approval.status != "pending":
        raise _resolved_conflict(approval)
    resolved = _approval_apply(
        approval=approval,
        # The call goes on (as it was, or sent again) or is closed as not having happened.
        outcome=Outcome.REJECTED if answer == ReviewAnswer.NOT_TAKEN else Outcome.APPROVED,
        actor=user.get_username(),
        user=user,
        comment=comment,
        answer=answer,
        answer_result=result if answer == ReviewAnswer.TOOK_EFFECT else None,
    )
    if resolved is None:
        fresh = approval_get(approval_id=approval.pk)
        raise _resolved_conflict(fresh or approval)
    return resolved


def _four_eyes_check(*, approval: Approval, user: User) -> None:
    """403 `four_eyes` when the decider owns the approval's session (APPROVAL_FOUR_EYES)."""
    owner_id = (
        Session.objects.filter(pk=approval.session_id).values_list("owner_id", flat=True).first()
    )
    if four_eyes_forbids(session_owner_id=owner_id, decider_id=user.pk):
        raise Forbidden(
            "this approval belongs to a session you own; another approver must decide it "
            "(four-eyes rule)",
            details={"session": str(approval.session_id)},
            code="four_eyes",
        )


def _resolved_conflict(approval: Approval) -> Conflict:
    if (
        approval.status == "pending"
        and approval.deadline is not None
        and approval.deadline <= timezone.now()
    ):
        # Past its deadline: the approval's timeout policy decides it, not a late approver.
        return Conflict(
            f"approval {approval.pk} passed its deadline; its timeout policy applies",
            details={"status": approval.status, "deadline": approval.deadline.isoformat()},
            code="approval_expired",
        )
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


def session_resume(
    *, session: Session, actor: str = "", key_roles: Sequence[str] | None = None
) -> Session:
    """Continue a run that stopped in `error`, from where it stopped. A key's request
    (`key_roles` given) needs the session's role; an operator's (None) does not."""
    with transaction.atomic():
        locked = Session.objects.select_for_update(of=("self",), no_key=True).get(pk=session.pk)
        if key_roles is not None:
            session_role_check(role=locked.role, key_roles=key_roles)
        if State(locked.state) != State.ERROR:
            raise Conflict(
                f"only a session in error can be resumed; this one is {locked.state}",
                code="not_resumable",
            )
        run_resume(session=locked, actor=actor)
        run_enqueue_on_commit(locked.pk, locked.value)
    return locked


# --- Human takeover: an operator answers, runs a tool by hand, hands back ------------

WAITING: frozenset[State] = frozenset(
    {State.AWAITING_APPROVAL, State.PAUSED_FOR_USER, State.WAITING_TIMER, State.ERROR}
)


def _operator_content(content: str) -> str:
    if not content or not content.strip():
        raise InvalidInput("write the message first", details={"field": "content"})
    if len(content) > settings.MAX_MESSAGE_CHARS:
        raise PayloadTooLarge(
            f"the message has {len(content)} characters; the limit is {settings.MAX_MESSAGE_CHARS}",
            details={"field": "content"},
        )
    return content.strip()


def session_force_finish(*, session: Session, content: str, actor: str) -> Session:
    """End a turn that waits (on a person, the user, a clock) or failed, with the operator's
    message as the answer. A running step must be cancelled first (409)."""
    content = _operator_content(content)
    with transaction.atomic():
        locked = Session.objects.select_for_update(of=("self",), no_key=True).get(pk=session.pk)
        state = State(locked.state)
        if state not in WAITING:
            raise Conflict(
                f"a session that is {state.value} cannot be force-finished"
                + (" while a step runs; cancel it first" if state in RUNNABLE else ""),
                details={"state": state.value},
                code="not_finishable",
            )
        if state == State.AWAITING_APPROVAL:
            approvals_cancel(
                session_id=locked.pk, actor=actor, reason="force-finished by an operator"
            )
        operator_finish(session=locked, content=content, actor=actor)
        if locked.queued_count:
            run_enqueue_on_commit(locked.pk, locked.value)
    return locked


def _taken_over(session: Session) -> Session:
    """The locked session, if no turn runs or waits (takeover happens between turns)."""
    locked = Session.objects.select_for_update(of=("self",), no_key=True).get(pk=session.pk)
    if State(locked.state) not in TURN_ENDED:
        raise Conflict(
            f"the session is {locked.state}: cancel or force-finish its turn before taking over",
            details={"state": locked.state},
            code="turn_in_progress",
        )
    return locked


def session_operator_reply(*, session: Session, content: str, actor: str) -> Message:
    """The operator answers the user in the agent's place (recorded as from the operator)."""
    content = _operator_content(content)
    with transaction.atomic():
        return operator_reply(session=_taken_over(session), content=content, actor=actor)


def session_operator_tool_run(
    *, session: Session, tool_name: str, arguments: Any, actor: str
) -> ToolCall:
    """Run one of the agent's tools by hand: the session's role gating, schema validation,
    an idempotency key and the same records (call row, messages, events) as a model's call."""
    if not isinstance(arguments, dict):
        raise InvalidInput("arguments must be a JSON object", details={"field": "arguments"})
    tools = tools_for_agent(list(session.agent.tools), role=session.role)
    if tool_name not in tools:
        raise Forbidden(
            f"tool {tool_name!r} is not available to this session's agent and role",
            details={"field": "tool", "available": sorted(tools)},
        )
    with transaction.atomic():
        intent = operator_tool_intent(
            session=_taken_over(session), tool_name=tool_name, arguments=arguments, actor=actor
        )
    # The step inserts rows in bulk; the stored row (with its id) is the one to update.
    call = ToolCall.objects.get(idempotency_key=intent.idempotency_key)
    if tools[tool_name].side_effects:
        ToolCall.objects.filter(pk=call.pk).update(dispatched_at=timezone.now())
    # Outside any transaction: the tool may be an HTTP call.
    [outcome] = io_loop.run(
        execute_all(
            [
                ToolInvocation(
                    call_id=call.call_id,
                    name=tool_name,
                    arguments=arguments,
                    idempotency_key=call.idempotency_key,
                )
            ],
            tools,
            session.role,
            step_timeout_s=session.agent.step_timeout_s,
        )
    )
    with transaction.atomic():
        locked = Session.objects.select_for_update(of=("self",), no_key=True).get(pk=session.pk)
        operator_tool_result(session=locked, call=call, outcome=outcome, actor=actor)
    return call


def session_hand_back(*, session: Session, actor: str) -> Session:
    """Give the session back to the agent: the model decides from the history as it stands."""
    with transaction.atomic():
        locked = _taken_over(session)
        if State(locked.state) == State.ERROR:
            run_resume(session=locked, actor=actor)
        else:
            hand_back(session=locked, actor=actor)
        run_enqueue_on_commit(locked.pk, locked.value)
    return locked


def session_fork(
    *,
    session: Session,
    step: int,
    owner: User | None = None,
    actor: str = "",
    role: str | None = None,
    key_roles: Sequence[str] | None = None,
) -> Session:
    """A new session from checkpoint `step` of this one; the original is untouched.

    0. Its role is `role`, or else the source's. A key's fork (`key_roles` given) must
       hold that role (`session_role_check`); an operator's (None) keeps the source's.
    1. Copy the history the checkpoint covers (messages up to its `message_seq`),
       dropping a trailing tool request whose results lie beyond it.
    2. If the copy ends with the user or a tool result, the model decides next
       (-> tool_loop) and a worker is woken; otherwise it waits for the user.
    3. The next model step compares the environment recorded at the fork with
       today's and tells the model what changed.
    """
    fork_role = role or session.role
    if key_roles is not None:
        session_role_check(role=fork_role, key_roles=key_roles)
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
            role=fork_role,
            metadata={**session.metadata, "forked_from": str(session.pk), "forked_at_step": step},
            forked_from=session,
            forked_at_step=step,
            turn=checkpoint.turn,
            message_seq=len(history),
            resume_check=True,
        )
        # What a summary in the copy replaced stays archived there; what only a
        # later summary of the source replaced is live again in the fork.
        through = max((summary_through(m) or 0 for m in history), default=0)
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
                    archived_at=(m.archived_at or timezone.now()) if i <= through else None,
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


def session_get(*, session_id: UUID | str) -> Session:
    try:
        return Session.objects.select_related("agent").get(pk=session_id)
    except (Session.DoesNotExist, ValueError, ValidationError):
        # A malformed id (Django raises ValidationError for it) is just as missing.
        raise NotFound(f"session {session_id} not found") from None


def memory_turn_keep(*, session_id: UUID | str, turn: int) -> int:
    """After a turn: store what the user asked to remember and what extraction found."""
    return turn_memory_keep(session_id=str(session_id), turn=turn)
