"""An operator takes over a session: answers for the agent, runs a tool by hand, hands back.

Each is a step like any other (transition, checkpoint, events), recorded with
the operator as the actor; the messages carry `data.from = "operator"` so
every reader (admin, API, the model's history) can tell them apart. A tool run
by hand commits its intent here; the tool phase runs it, as it runs the model's.
"""

import uuid
from typing import Any

from django.utils import timezone

from engine.gates.guards import canonical_json
from engine.model.context import tool_calls_json
from engine.moves.turn import OPERATOR_CALL_PREFIX, build_step, metered_commit, turn_finish
from llm.types import ToolCallRequest
from memory.tokens import count_message_tokens
from record.events import EventSpec, EventType, StopReason, ToolStarted
from record.models import Message, Session, ToolCall
from record.states import Trigger


def operator_message(session: Session, content: str, actor: str) -> Message:
    return Message(
        turn=session.turn,
        role="assistant",
        content=content,
        data={"from": "operator", "by": actor},
        token_count=count_message_tokens(content),
    )


def operator_finish(*, session: Session, content: str, actor: str) -> None:
    """End a waiting (or failed) turn with the operator's message as the answer (-> finished)."""
    turn_finish(
        session,
        None,
        Trigger.OPERATOR_ANSWER,
        f"answered by {actor}",
        stop_reason=StopReason.OPERATOR,
        actor=actor,
        answer=operator_message(session, content, actor),
    )


def operator_reply(*, session: Session, content: str, actor: str) -> Message:
    """The operator's reply to the user in a turn that is over; the state does not move."""
    message = operator_message(session, content, actor)
    metered_commit(
        build_step(
            session,
            None,
            trigger=None,
            phase="operator_reply",
            reason=f"reply by {actor}",
            actor=actor,
            messages=[message],
        )
    )
    return message


def operator_tool_intent(
    *, session: Session, tool_name: str, arguments: dict[str, Any], actor: str
) -> ToolCall:
    """Commit a hand-run call's intent like a model's: its row and idempotency key, the
    assistant's request, tool.started, and the move to `tool_wait` (from a turn that has
    ended). A worker's tool step runs it from there as it runs any call: role gating and
    the schema, the risk assessment and its pre-run checkpoint, the approval gate, credits,
    the dispatched mark and, after a crash, the probe; its results end the turn again
    (engine/moves/turn.py `tool_results`)."""
    call_id = f"{OPERATOR_CALL_PREFIX}{uuid.uuid4().hex[:12]}"
    step_no = session.step + 1
    call = ToolCall(
        turn=session.turn,
        step=step_no,
        position=0,
        call_id=call_id,
        tool_name=tool_name,
        input=arguments,
        idempotency_key=f"{session.pk}:operator:{call_id}",
    )
    requested = tool_calls_json([ToolCallRequest(id=call_id, name=tool_name, arguments=arguments)])
    message = Message(
        turn=session.turn,
        role="assistant",
        content="",
        tool_calls=requested,
        data={"from": "operator", "by": actor},
        token_count=count_message_tokens("", canonical_json(requested)),
    )
    metered_commit(
        build_step(
            session,
            None,
            trigger=Trigger.OPERATOR_TOOL,
            phase="operator_tool",
            reason=f"{tool_name} run by {actor}",
            actor=actor,
            messages=[message],
            new_tool_calls=[call],
            after_events=[
                EventSpec(
                    EventType.TOOL_STARTED,
                    ToolStarted(call_id=call_id, tool=tool_name, input=arguments, turn=call.turn),
                )
            ],
            checkpoint={"pending": [[call_id, call.idempotency_key]], "by": actor},
            # The tool phase's time limits count from here; an earlier failure is history.
            set_fields={"turn_started_at": timezone.now(), "last_error": ""},
        )
    )
    return call


def hand_back(*, session: Session, actor: str) -> None:
    """The agent takes over again: the model decides from the history as it stands (-> tool_loop)."""
    metered_commit(
        build_step(
            session,
            None,
            trigger=Trigger.HAND_BACK,
            phase="hand_back",
            reason=f"handed back by {actor}",
            actor=actor,
            set_fields={"iteration": 0, "turn_started_at": timezone.now(), "last_error": ""},
        )
    )
