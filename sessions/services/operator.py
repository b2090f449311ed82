"""Human takeover: an operator answers, runs a tool by hand, hands back."""

import logging
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from approvals.services import (
    approvals_cancel,
)
from engine import (
    hand_back,
    operator_finish,
    operator_reply,
    operator_tool_intent,
    operator_tool_result,
    run_resume,
)
from runtime import io_loop
from sessions import dispatch
from sessions.errors import Conflict, Forbidden, InvalidInput, PayloadTooLarge
from sessions.models import (
    Message,
    Session,
    ToolCall,
)
from sessions.states import RUNNABLE, TURN_ENDED, State
from tools.execution import ToolInvocation, execute_all, tools_for_agent

logger = logging.getLogger(__name__)


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
        locked = _conversation(
            Session.objects.select_for_update(of=("self",), no_key=True).get(pk=session.pk)
        )
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
            dispatch.run_enqueue_on_commit(locked.pk, locked.value)
    return locked


def _taken_over(session: Session) -> Session:
    """The locked session, if no turn runs or waits (takeover happens between turns)."""
    locked = _conversation(
        Session.objects.select_for_update(of=("self",), no_key=True).get(pk=session.pk)
    )
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
        dispatch.run_enqueue_on_commit(locked.pk, locked.value)
    return locked
