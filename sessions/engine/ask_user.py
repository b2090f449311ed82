"""The model asks the user (`ask_user`): the session waits in `paused_for_user`, holding no
worker; the user's next message is the call's result and the same turn goes on.

- `questions_of`, in the tool phase: which of the step's calls are well-formed
  questions (they are left open; `tool_results` pauses the session).
- `user_answer`, for the next user message or the question's deadline (the
  default answer, filled in by the sweeper): the call's result, -> tool_loop.
"""

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from memory.tokens import count_message_tokens
from tools.builtin import ASK_USER_HANDLER
from tools.execution import ToolSnapshot
from tools.rendering import render_success

from ..events import EventSpec, EventType, Progress
from ..models import Message, MessageStatus, Session, ToolCall, ToolCallStatus
from ..states import Trigger
from .commit import step_commit
from .moves import build_step


@dataclass(frozen=True)
class Question:
    call: ToolCall
    due_at: datetime | None

    @property
    def question(self) -> str:
        return str(self.call.input.get("question", ""))

    def event(self, turn: int) -> EventSpec:
        data: Progress = {
            "stage": "question",
            "turn": turn,
            "tool": self.call.tool_name,
            "call_id": self.call.call_id,
            "question": self.question,
            "options": [str(o) for o in self.call.input.get("options") or []],
            "deadline": self.due_at.isoformat().replace("+00:00", "Z") if self.due_at else None,
        }
        return EventSpec(EventType.PROGRESS, data)


def questions_of(calls: list[ToolCall], tools: dict[str, ToolSnapshot]) -> list[Question]:
    """The step's well-formed `ask_user` calls (a malformed one runs, and its error goes back)."""
    now = timezone.now()
    found: list[Question] = []
    for call in calls:
        tool = tools.get(call.tool_name)
        if tool is None or tool.handler != ASK_USER_HANDLER or call.error:
            continue
        arguments = call.input
        if not isinstance(arguments, dict) or not str(arguments.get("question") or "").strip():
            continue
        deadline = arguments.get("deadline_s")
        due = (
            now + timedelta(seconds=deadline)
            if isinstance(deadline, int) and deadline > 0
            else None
        )
        found.append(Question(call=call, due_at=due))
    return found


def open_question(session: Session) -> ToolCall | None:
    """The open `ask_user` call of the session's current turn, if it waits for the user."""
    return (
        ToolCall.objects.filter(session=session, turn=session.turn, status=ToolCallStatus.EXECUTING)
        .order_by("step", "position")
        .first()
    )


def user_answer(
    *,
    session: Session,
    call: ToolCall,
    answer: str,
    by: str,
    owner: str | None = None,
    add_fields: dict[str, Any] | None = None,
    extra_context: dict[str, Any] | None = None,
) -> Message:
    """Write the answer as the call's result and continue the turn (-> tool_loop); the
    customer app's `extra_context` sent with it is kept on the result's message."""
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
    )
    step_commit(
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
        )
    return True
