"""The model asks the user (`ask_user`): which of a tool step's calls are questions, and
which question a session waits on. The session then waits in `paused_for_user`, holding
no worker; the answer is a move (engine/moves/ask_user.py).

- `questions_of`, in the tool phase: which of the step's calls are well-formed
  questions (they are left open; `tool_results` pauses the session).
- `open_question`: the call the session's current turn waits on.
"""

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.utils import timezone

from engine.gates import Verdict, Wait
from record.events import EventSpec, EventType, Progress
from record.models import Session, ToolCall, ToolCallStatus
from tools.builtin import ASK_USER_HANDLER
from tools.execution import ToolSnapshot


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


def questions_of(calls: list[ToolCall], tools: dict[str, ToolSnapshot]) -> Verdict[Question]:
    """The step's first well-formed `ask_user` call (a malformed one runs, and its error goes
    back): the step waits for the user's answer, its intent (left open: the next message
    is its result)."""
    now = timezone.now()
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
        return Verdict(wait=Wait("user", deadline if due else None), intent=Question(call, due))
    return Verdict()


def open_question(session: Session) -> ToolCall | None:
    """The open `ask_user` call of the session's current turn, if it waits for the user
    (not a call of the client's own tools, which waits for the client's result)."""
    return (
        ToolCall.objects.filter(
            session=session, turn=session.turn, status=ToolCallStatus.EXECUTING, client=False
        )
        .order_by("step", "position")
        .first()
    )
