"""A workflow run's moves: each node step commits its nodes' outputs, the next active nodes
and a checkpoint of where the run stands, in the one conditional UPDATE every step makes.

The node phase (engine/phases/node.py) decides; the moves here only write. Tool, human and
wait nodes open calls (-> tool_wait) that the tool phase runs with all its guarantees; the
results fold back to `processing`, where the node phase reads them. A read-only call the
node step ran itself is inserted with its result, in the commit of that node's output.
"""

import json
from dataclasses import dataclass, field
from typing import Any

from engine.model.usage import ModelSpend
from engine.moves.turn import build_step, metered_commit, turn_summary
from engine.store.open_calls import (
    cached_output_keep,
    cached_output_statement,
    open_calls_statement,
    prefetched_keep,
)
from engine.store.turn_calls import turn_calls_counted
from memory.tokens import count_message_tokens
from record.events import EventSpec, EventType, StopReason
from record.models import Message, ModelCall, Session, ToolCall
from record.states import Trigger
from workflows.state import RunState


@dataclass
class NodeWrites:
    """What one node step produced, for its one commit."""

    state: RunState
    events: list[EventSpec] = field(default_factory=list)
    new_calls: list[ToolCall] = field(default_factory=list)
    # Read-only calls the step ran itself (engine/phases/node.py): inserted with their
    # results, tool messages (`messages`) and `tool.finished` events; no tool step follows.
    ran_calls: list[ToolCall] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)
    # Where each of `messages`' events goes among `events` (Step.message_slots): the node
    # events tell the path as it was taken, each call's result inside its node.
    message_slots: list[int] = field(default_factory=list)
    reopened: list[ToolCall] = field(default_factory=list)
    # The (tool, arguments) of the call the next step will run itself: the commit reads
    # its cached output for that step (`cached_output_read`).
    cached_read: tuple[str, dict[str, Any]] | None = None
    model_calls: list[ModelCall] = field(default_factory=list)
    # The nodes that finished or failed in this step (the checkpoint says which).
    settled: list[str] = field(default_factory=list)
    failed: tuple[str, str] | None = None  # (node, error)
    finished: bool = False
    cancelled: bool = False


def _checkpoint(writes: NodeWrites, state: dict[str, Any]) -> dict[str, Any]:
    # The whole run state: a fork from this node's checkpoint starts from exactly here.
    checkpoint: dict[str, Any] = {
        "nodes": writes.settled,
        "workflow": state,
        "pending": [[c.call_id, c.idempotency_key] for c in writes.new_calls + writes.reopened],
    }
    if writes.ran_calls:
        # As a tool step's results' checkpoint says it.
        checkpoint["done"] = [[c.call_id, c.status, c.attempts] for c in writes.ran_calls]
    return checkpoint


def _result_text(result: Any) -> str:
    if isinstance(result, str):
        return result
    return json.dumps(result, ensure_ascii=False, sort_keys=True)


def nodes_commit(session: Session, owner: str, writes: NodeWrites) -> None:
    """The node step's one move.

    - calls opened (tool, human, wait, a retry): -> tool_wait, read back for the tool step;
    - the run reached `end`: -> finished, the result as the answer and in `turn.finished`;
    - a node failed for good: -> error, with the node and why;

    Its events in the order things happened: the node events along the path (a call run in
    the step inside its node, the answer after the last node), then the move, then
    `turn.finished`, the turn's last event.
    - otherwise (a batch of a map's model calls): no move, the progress is checkpointed.
    """
    spend = ModelSpend(calls=writes.model_calls, iteration=session.iteration)
    usage = spend.usage
    state = writes.state.to_json()
    set_fields: dict[str, Any] = {"workflow_state": state}
    messages: list[Message] = list(writes.messages)
    slots = list(writes.message_slots)
    after: list[EventSpec] = []
    trigger: Trigger | None = None
    reason = ", ".join(writes.settled)
    if writes.new_calls or writes.reopened:
        trigger = Trigger.TOOL_CALLS
        reason = ", ".join(c.call_id for c in writes.new_calls + writes.reopened)
    elif writes.failed is not None:
        node, error = writes.failed
        trigger = Trigger.FAILURE
        reason = f"node {node} failed: {error}"[:2000]
        set_fields["last_error"] = reason
        summary = turn_summary(
            session, StopReason.ERROR, usage, calls=turn_calls_counted(session, writes.ran_calls)
        )
        summary["reason"] = reason
        after.append(EventSpec(EventType.TURN_FINISHED, summary))
    elif writes.finished:
        trigger = Trigger.ANSWER
        result = state.get("result")
        text = _result_text(result)
        messages.append(
            Message(
                turn=session.turn,
                role="assistant",
                content=text,
                data={"result": result},
                token_count=count_message_tokens(text),
            )
        )
        slots.append(len(writes.events))  # the answer after the last node finished
        summary = turn_summary(
            session, StopReason.ANSWER, usage, calls=turn_calls_counted(session, writes.ran_calls)
        )
        summary["result"] = result
        after.append(EventSpec(EventType.TURN_FINISHED, summary))
    step = build_step(
        session,
        owner,
        trigger=trigger,
        phase="nodes",
        reason=reason,
        messages=messages,
        new_tool_calls=writes.new_calls + writes.ran_calls,
        updated_tool_calls=writes.reopened,
        model_calls=writes.model_calls,
        events=writes.events,
        after_events=after,
        checkpoint=_checkpoint(writes, state),
        message_slots=slots,
        add_fields=usage.add_fields(),
        set_fields=set_fields,
        # A cancel that came meanwhile is carried out by the run loop at the next step.
        unless_cancel_requested=trigger is not None,
    )
    cached_read = writes.cached_read if trigger is None else None
    if trigger == Trigger.TOOL_CALLS:
        step.then_read = open_calls_statement(session, session.turn)
    elif cached_read is not None:
        step.then_read = cached_output_statement(session, *cached_read)
    committed = metered_commit(step)
    if trigger == Trigger.TOOL_CALLS:
        prefetched_keep(session, committed.version, session.turn, committed.read or [])
    elif cached_read is not None:
        cached_output_keep(session, committed.version, *cached_read, committed.read or [])
