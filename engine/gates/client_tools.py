"""The client's own tools (the OpenAI-compatible request's `tools`, offered beside the
agent's: engine/gates/turn_options.py). A call the model makes to one is the client's
to run, not the platform's:

- `tool_intents` marks it (`ToolCall.client`), so whatever its name it never reaches
  the tool phase's gates or the executor;
- the tool phase runs the step's other calls as usual (role gating, approvals, ...)
  and leaves the client's open: the turn waits in `paused_for_user`, holding no
  worker, and a `progress` event (stage `client_tools`) names the calls;
- the client's next request brings their results (engine/moves/ask_user.py
  `client_results`) and the same turn goes on; past the deadline
  (`OPENAI_CLIENT_TOOLS_WAIT_S`) the sweeper fails them and the model is told.
"""

import json
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.utils import timezone

from engine.gates import Verdict, Wait
from record.events import ClientCall, EventSpec, EventType, Progress
from record.models import Session, ToolCall, ToolCallStatus


@dataclass(frozen=True)
class ClientWait:
    calls: list[ToolCall]
    due_at: datetime

    def event(self, turn: int) -> EventSpec:
        data: Progress = {
            "stage": "client_tools",
            "turn": turn,
            "calls": [
                ClientCall(call_id=c.call_id, tool=c.tool_name, input=c.input) for c in self.calls
            ],
        }
        return EventSpec(EventType.PROGRESS, data)


def client_wait(calls: list[ToolCall]) -> Verdict[ClientWait]:
    """The step's calls the client runs, if any: the turn waits for their results until the
    intent's `due_at` (they never reach another gate or the executor)."""
    mine = [c for c in calls if c.client]
    if not mine:
        return Verdict()
    wait_s = float(settings.OPENAI_CLIENT_TOOLS_WAIT_S)
    waits = ClientWait(calls=mine, due_at=timezone.now() + timedelta(seconds=wait_s))
    return Verdict(wait=Wait("client", wait_s), intent=waits)


def open_client_calls(session: Session) -> list[ToolCall]:
    """The client's calls the session's current turn waits on, in the model's order."""
    return list(
        ToolCall.objects.filter(
            session=session, turn=session.turn, status=ToolCallStatus.EXECUTING, client=True
        ).order_by("step", "position")
    )


def client_result_error(text: str) -> str | None:
    """What went wrong, when the client's result of its tool reports an error, else None.

    The wire's `tool` message is only text, so the rule is the platform's own tools' one:
    a JSON object with `"ok": false`, or with a non-empty `"error"` (and no `"ok": true`).
    The model reads the text as sent either way; this decides how the call counts.
    """
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    error = data.get("error")
    if data.get("ok") is False:
        return str(error or "the client's tool reported a failure")[:2000]
    if error and data.get("ok") is not True:
        return (error if isinstance(error, str) else json.dumps(error, sort_keys=True))[:2000]
    return None
