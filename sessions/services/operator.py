"""Human takeover: an operator answers, runs a tool by hand, hands back."""

import logging
from typing import Any

from django.conf import settings
from django.db import transaction

from approvals.services import (
    approvals_cancel,
)
from audit.models import AuditAction
from engine import (
    hand_back,
    operator_finish,
    operator_reply,
    operator_tool_intent,
    run_resume,
)
from record import dispatch
from record.errors import Conflict, Forbidden, InvalidInput, PayloadTooLarge
from record.models import (
    Message,
    Session,
    ToolCall,
)
from record.states import RUNNABLE, TURN_ENDED, State
from sessions.services.trail import session_audit
from tools.execution import tools_for_agent

logger = logging.getLogger(__name__)


# --- Human takeover: an operator answers, runs a tool by hand, hands back ------------

WAITING: frozenset[State] = frozenset(
    {
        State.AWAITING_APPROVAL,
        State.PAUSED_FOR_USER,
        State.WAITING_TIMER,
        State.WAITING_CREDITS,
        State.ERROR,
    }
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


def _conversation(locked: Session) -> Session:
    """Takeover speaks for an agent in a conversation; a workflow run has no one to answer
    (cancel, resume or fork it instead)."""
    if locked.workflow_version_id is not None:
        raise Conflict(
            "this session is a workflow run: it has no conversation to take over "
            "(cancel, resume or fork it)",
            details={"session": str(locked.pk)},
            code="not_a_conversation",
        )
    return locked


def session_force_finish(*, session: Session, content: str, actor: str) -> Session:
    """End a turn that waits (on a person, the user, a clock) or failed, with the operator's
    message as the answer. A running step must be cancelled first (409)."""
    content = _operator_content(content)
    with transaction.atomic():
        locked = _conversation(Session.objects.locked().get(pk=session.pk))
        state = State(locked.state)
        if state not in WAITING:
            raise Conflict(
                f"a session that is {state.value} cannot be force-finished"
                + (" while a step runs; cancel it first" if state in RUNNABLE else ""),
                details={"state": state.value},
                code="not_finishable",
            )
        closed = []
        if state == State.AWAITING_APPROVAL:
            closed = approvals_cancel(
                session_id=locked.pk, actor=actor, reason="force-finished by an operator"
            )
        operator_finish(session=locked, content=content, actor=actor)
        session_audit(
            action=AuditAction.SESSION_FORCE_FINISH,
            session=locked,
            actor=actor,
            data={
                "from_state": state.value,
                "answer_chars": len(content),
                "approvals_cancelled": [str(a.pk) for a in closed],
            },
        )
        if locked.queued_count:
            dispatch.run_enqueue_on_commit(locked.pk, locked.value)
    return locked


def _taken_over(session: Session) -> Session:
    """The locked session, if no turn runs or waits (takeover happens between turns)."""
    locked = _conversation(Session.objects.locked().get(pk=session.pk))
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
        locked = _taken_over(session)
        message = operator_reply(session=locked, content=content, actor=actor)
        session_audit(
            action=AuditAction.SESSION_REPLY,
            session=locked,
            actor=actor,
            data={"message_seq": message.seq, "chars": len(content)},
        )
        return message


# The model's question to the user: an operator asks by replying instead.
NOT_BY_HAND = frozenset({"ask_user"})


def session_operator_tool_run(
    *, session: Session, tool_name: str, arguments: Any, actor: str
) -> ToolCall:
    """Run one of the agent's tools by hand, between turns, as a model's call runs.

    The intent commits here (the call row with a fresh idempotency key, the assistant's
    request, `tool.started`, the session -> `tool_wait`) with its audit entry, and a
    worker is woken. Its tool step then runs the call through everything a model's call
    goes through: the session's role gating and the tool's schema, the risk assessment
    (and a level 2+ call's pre-run checkpoint), the approval gate (the session waits in
    `awaiting_approval`), credits, the dispatched mark, and after a crash the probe. Its
    result ends the turn again (stop reason `operator`); the model decides only once the
    operator hands back.
    """
    if not isinstance(arguments, dict):
        raise InvalidInput("arguments must be a JSON object", details={"field": "arguments"})
    if tool_name in NOT_BY_HAND:
        raise Forbidden(
            f"{tool_name} is the model's question to the user; reply to the user instead",
            details={"field": "tool"},
        )
    tools = tools_for_agent(list(session.agent.tools), role=session.role)
    if tool_name not in tools:
        raise Forbidden(
            f"tool {tool_name!r} is not available to this session's agent and role",
            details={"field": "tool", "available": sorted(tools)},
        )
    with transaction.atomic():
        locked = _taken_over(session)
        intent = operator_tool_intent(
            session=locked, tool_name=tool_name, arguments=arguments, actor=actor
        )
        session_audit(
            action=AuditAction.SESSION_TOOL_RUN,
            session=locked,
            actor=actor,
            after={"arguments": arguments},
            data={
                "tool": tool_name,
                "call": intent.call_id,
                "idempotency_key": intent.idempotency_key,
            },
        )
        dispatch.run_enqueue_on_commit(locked.pk, locked.value)
    # The step inserts rows in bulk; the stored row (with its id) is the one to return.
    return ToolCall.objects.get(idempotency_key=intent.idempotency_key)


def session_hand_back(*, session: Session, actor: str) -> Session:
    """Give the session back to the agent: the model decides from the history as it stands."""
    with transaction.atomic():
        locked = _taken_over(session)
        state = locked.state
        if State(locked.state) == State.ERROR:
            run_resume(session=locked, actor=actor)
        else:
            hand_back(session=locked, actor=actor)
        session_audit(
            action=AuditAction.SESSION_HAND_BACK,
            session=locked,
            actor=actor,
            data={"from_state": state},
        )
        dispatch.run_enqueue_on_commit(locked.pk, locked.value)
    return locked
