"""The answer to the model's `ask_user` question, as a move: the user's next message (or
the question's default, at its deadline) is the call's result and the same turn goes on.

- `user_answer`, for the next user message or the question's deadline (the
  default answer, filled in by the sweeper): the call's result, -> tool_loop.
- `queued_answer`, in the run loop: a message queued while the session ran answers it.
- `client_results`, for the client's own tools' calls (engine/gates/client_tools.py):
  the client's next request brings their results (or the sweeper, past the deadline,
  their failure), -> tool_loop.

Which calls are questions is engine/gates/questions.py.
"""

from typing import Any

from django.db import transaction
from django.utils import timezone

from engine.gates.client_tools import client_result_error
from engine.gates.questions import open_question
from engine.moves.turn import build_step, metered_commit, turn_finish
from llm.types import ModelOptions
from memory.tokens import count_message_tokens
from record.events import AgentChanged, EventSpec, EventType, StopReason, ToolFinished
from record.models import (
    Agent,
    Message,
    MessageStatus,
    Refusal,
    Session,
    ToolCall,
    ToolCallStatus,
)
from record.states import Trigger
from tools.rendering import render_success


def user_answer(
    *,
    session: Session,
    call: ToolCall,
    answer: str,
    by: str,
    owner: str | None = None,
    add_fields: dict[str, Any] | None = None,
    extra_context: dict[str, Any] | None = None,
    turn_options: ModelOptions | None = None,
) -> Message:
    """Write the answer as the call's result and continue the turn (-> tool_loop); the
    customer app's `extra_context` and the client's `turn_options` sent with it are kept
    on the result's message (the turn's next steps read them there)."""
    output: dict[str, Any] = {"answer": answer, "by": by}
    content = render_success(output)
    call.status = ToolCallStatus.SUCCESS
    call.output = output
    call.error = ""
    call.finished_at = timezone.now()
    call.elapsed_ms = int((call.finished_at - call.created_at).total_seconds() * 1000)
    message = Message(
        turn=session.turn,
        role="tool",
        content=content,
        tool_call_id=call.call_id,
        name=call.tool_name,
        data=output,
        token_count=count_message_tokens(content),
        extra_context=extra_context,
        turn_options=turn_options,
    )
    metered_commit(
        build_step(
            session,
            owner,
            trigger=Trigger.USER_ANSWER,
            phase="user_answer",
            reason=f"answered by {by}",
            actor=by if by != "user" else "",
            messages=[message],
            updated_tool_calls=[call],
            set_fields={"timer_due_at": None, "turn_started_at": timezone.now()},
            add_fields=add_fields,
            checkpoint={"answered": call.call_id},
        )
    )
    return message


def queued_answer(session: Session, owner: str) -> bool:
    """The oldest queued user message answers the open question (it leaves the queue; its text
    is the call's result, so the history keeps each tool request next to its result)."""
    call = open_question(session)
    queued = (
        Message.objects.filter(session=session, status=MessageStatus.QUEUED).order_by("id").first()
    )
    if call is None or queued is None:
        return False
    with transaction.atomic():
        Message.objects.filter(pk=queued.pk).delete()
        user_answer(
            session=session,
            call=call,
            answer=queued.content,
            by="user",
            owner=owner,
            add_fields={"queued_count": -1},
            extra_context=queued.extra_context,
            turn_options=queued.turn_options,
        )
    return True


CLIENT_DEADLINE_ERROR = "the client did not return a result before the deadline"


def client_results(
    *,
    session: Session,
    calls: list[ToolCall],
    results: dict[str, str],
    by: str,
    owner: str | None = None,
    turn_options: ModelOptions | None = None,
    handoff_to: Agent | None = None,
) -> list[Message]:
    """Write the client's results of its tool calls (`results` by call id, one for each)
    and continue the turn (-> tool_loop) in one step.

    A result is the client's text as the model reads it (JSON or not). The client's
    `turn_options` sent with them (its tools again, its sampling) are kept on the first
    result's message, where the turn's next steps read them. `handoff_to`: the client
    sent them to another agent (its own handoff), which decides from the next step on,
    as after a model's handoff (a `handoff` transition and `agent.changed`).
    """
    now = timezone.now()
    messages: list[Message] = []
    events: list[EventSpec] = []
    for call in calls:
        content = results[call.call_id]
        # The model reads the client's text as sent; an error it reports counts as one.
        error = client_result_error(content)
        call.status = ToolCallStatus.SUCCESS if error is None else ToolCallStatus.FAILED
        call.output, call.error = {"result": content}, error or ""
        call.finished_at = now
        call.elapsed_ms = int((now - call.created_at).total_seconds() * 1000)
        messages.append(
            Message(
                turn=session.turn,
                role="tool",
                content=content,
                tool_call_id=call.call_id,
                name=call.tool_name,
                token_count=count_message_tokens(content),
                turn_options=turn_options if not messages else None,
            )
        )
        finished = ToolFinished(
            call_id=call.call_id,
            tool=call.tool_name,
            status=call.status,
            elapsed_ms=call.elapsed_ms,
            output=call.output,
            error=call.error,
            turn=call.turn,
        )
        events.append(EventSpec(EventType.TOOL_FINISHED, finished))
    set_fields: dict[str, Any] = {"timer_due_at": None, "turn_started_at": now}
    trigger = Trigger.USER_ANSWER
    if handoff_to is not None and handoff_to.pk != session.agent_id:
        trigger, set_fields["agent_id"] = Trigger.HANDOFF, handoff_to.pk
        changed: AgentChanged = {
            "from": session.agent.slug,
            "to": handoff_to.slug,
            "reason": f"handed over by the {by}",
        }
        events.append(EventSpec(EventType.AGENT_CHANGED, changed))
    metered_commit(
        build_step(
            session,
            owner,
            trigger=trigger,
            phase="client_results",
            reason=f"results by {by}",
            actor=by if by not in ("user", "client") else "",
            messages=messages,
            updated_tool_calls=calls,
            events=events,
            set_fields=set_fields,
            checkpoint={"answered": [c.call_id for c in calls]},
        )
    )
    return messages


def client_calls_expire(*, session: Session, actor: str) -> None:
    """End a turn whose client did not send its tools' results before the deadline
    (OPENAI_CLIENT_TOOLS_WAIT_S): nobody listens any more, so the model is not called
    again; the calls count as expired and the turn ends `expired` (-> cancelled)."""
    turn_finish(
        session,
        None,
        Trigger.CANCEL,
        CLIENT_DEADLINE_ERROR,
        stop_reason=StopReason.EXPIRED,
        actor=actor,
        refusal=Refusal.EXPIRED,
        closed_error=CLIENT_DEADLINE_ERROR,
    )
