"""Typed events of a session's stream, one dataclass per type of the server's
`record/events.py` (tests/clients/test_events.py keeps the two in step).

Every event carries the frame's envelope (`seq`, `type`, `session`, `ts`, and the
raw `data`); a type this library does not know yet arrives as a plain `Event`.
Payload keys that are Python keywords or clash with the envelope are renamed:
`state.changed` `from`/`to` -> `from_state`/`to_state`, and `message.completed`
`seq` (the message's place in the history) -> `message_seq`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from datetime import datetime
from decimal import Decimal
from typing import Any, ClassVar

from .models import TurnCalls, parse_time


@dataclass(frozen=True, kw_only=True)
class Event:
    """A frame of the stream. `seq` is None for ephemeral frames (`message.delta`,
    `progress`, a websocket's own `error` about a bad client frame)."""

    TYPE: ClassVar[str] = ""
    # Payload key -> attribute name, where they differ.
    RENAMED: ClassVar[dict[str, str]] = {}

    seq: int | None
    type: str
    session: str
    ts: datetime | None
    data: dict[str, Any] = field(default_factory=dict, repr=False)
    # Fields the server cut to keep the event within its size limit, with their sizes in
    # bytes; on a frame that stands for an event too large to send, {"event_bytes": N}
    # and `url`, the REST page that holds the event whole.
    truncated: dict[str, int] = field(default_factory=dict, repr=False)
    url: str = ""

    @property
    def persisted(self) -> bool:
        return self.seq is not None


@dataclass(frozen=True, kw_only=True)
class StateChanged(Event):
    TYPE: ClassVar[str] = "state.changed"
    RENAMED: ClassVar[dict[str, str]] = {"from": "from_state", "to": "to_state"}
    from_state: str = ""
    to_state: str = ""
    trigger: str = ""
    reason: str = ""
    trace_id: str = ""  # set when traces are on (the README's "Observability")


@dataclass(frozen=True, kw_only=True)
class MessageDelta(Event):
    TYPE: ClassVar[str] = "message.delta"
    text: str = ""
    turn: int = 0


@dataclass(frozen=True, kw_only=True)
class MessageCompleted(Event):
    TYPE: ClassVar[str] = "message.completed"
    RENAMED: ClassVar[dict[str, str]] = {"seq": "message_seq"}
    message_seq: int = 0
    role: str = ""
    content: str = ""
    turn: int = 0
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    tool_call_id: str = ""
    name: str = ""


@dataclass(frozen=True, kw_only=True)
class Progress(Event):
    TYPE: ClassVar[str] = "progress"
    stage: str = ""
    turn: int = 0
    tool: str = ""
    level: int | None = None
    kind: str = ""
    balance: int | None = None
    low_water_mark: int | None = None
    question: str = ""
    options: list[str] = field(default_factory=list)
    call_id: str = ""
    deadline: str | None = None
    # stage "client_tools": the calls of the client's own tools the turn waits on.
    calls: list[dict[str, Any]] = field(default_factory=list)
    # stage "credits_wait": the paid calls wait for their credit pool, granted highest
    # value / cost (`roi`) first; `note`: an estimate that failed and what stood in for it.
    value: float | None = None
    cost: int | None = None
    roi: float | None = None
    pool_free: int | None = None
    note: str = ""


@dataclass(frozen=True, kw_only=True)
class ToolStarted(Event):
    TYPE: ClassVar[str] = "tool.started"
    call_id: str = ""
    tool: str = ""
    input: Any = None
    turn: int = 0


@dataclass(frozen=True, kw_only=True)
class ToolFinished(Event):
    TYPE: ClassVar[str] = "tool.finished"
    call_id: str = ""
    tool: str = ""
    status: str = ""
    error: str = ""
    turn: int = 0
    elapsed_ms: int | None = None
    output: Any = None
    cached: bool = False
    coercions: list[Any] = field(default_factory=list)
    probed: str | None = None
    # A call that ran with an approver's edited arguments: what ran, and the model's.
    input: Any = None
    proposed_input: Any = None
    refusal: str = ""  # a call that did not run: rejected | expired | unpaid


@dataclass(frozen=True, kw_only=True)
class ApprovalRequested(Event):
    TYPE: ClassVar[str] = "approval.requested"
    approval_id: str = ""
    tool: str = ""
    arguments: dict[str, Any] = field(default_factory=dict)
    risk_level: int = 0
    deadline: str = ""


@dataclass(frozen=True, kw_only=True)
class ApprovalResolved(Event):
    TYPE: ClassVar[str] = "approval.resolved"
    approval_id: str = ""
    outcome: str = ""  # approved | rejected | expired | escalated | cancelled | withdrawn
    by: str = ""
    comment: str = ""
    previous: str = ""  # a changed decision: the one it replaces


@dataclass(frozen=True)
class TurnUsage:
    input_tokens: int = 0
    output_tokens: int = 0
    cost: Decimal = Decimal(0)


@dataclass(frozen=True, kw_only=True)
class TurnFinished(Event):
    TYPE: ClassVar[str] = "turn.finished"
    turn: int = 0
    stop_reason: str = ""
    iterations: int = 0
    usage: TurnUsage = field(default_factory=TurnUsage)
    # ok | tool_failures (a call failed, was rejected, expired or unpaid) | stopped | error
    outcome: str = ""
    calls: TurnCalls = field(default_factory=TurnCalls)
    reason: str = ""
    trace_id: str = ""  # set when traces are on
    result: Any = None  # a workflow run's result


@dataclass(frozen=True, kw_only=True)
class NodeStarted(Event):
    """A workflow run's node began (a visit number above 1 in a cycle)."""

    TYPE: ClassVar[str] = "node.started"
    node: str = ""
    kind: str = ""
    visit: int = 1
    input: Any = None


@dataclass(frozen=True, kw_only=True)
class NodeFinished(Event):
    TYPE: ClassVar[str] = "node.finished"
    node: str = ""
    output: Any = None
    next: str = ""  # the node the run goes to, or "end"


@dataclass(frozen=True, kw_only=True)
class NodeFailed(Event):
    TYPE: ClassVar[str] = "node.failed"
    node: str = ""
    error: str = ""


@dataclass(frozen=True, kw_only=True)
class AgentChanged(Event):
    """A handoff: from the next step on another agent answers, with the history kept."""

    TYPE: ClassVar[str] = "agent.changed"
    RENAMED: ClassVar[dict[str, str]] = {"from": "from_agent", "to": "to_agent"}
    from_agent: str = ""
    to_agent: str = ""
    reason: str = ""


@dataclass(frozen=True, kw_only=True)
class ChildStarted(Event):
    """An agent.<slug> call started a child session (its events are on its own stream)."""

    TYPE: ClassVar[str] = "child.started"
    call_id: str = ""
    session_id: str = ""
    agent: str = ""
    RENAMED: ClassVar[dict[str, str]] = {"session": "session_id"}


@dataclass(frozen=True, kw_only=True)
class ChildFinished(Event):
    TYPE: ClassVar[str] = "child.finished"
    RENAMED: ClassVar[dict[str, str]] = {"session": "session_id"}
    call_id: str = ""
    session_id: str = ""
    agent: str = ""
    state: str = ""


@dataclass(frozen=True, kw_only=True)
class ErrorEvent(Event):
    """A run failure (persisted, with a seq) or the socket's answer to a bad frame (no seq)."""

    TYPE: ClassVar[str] = "error"
    code: str = ""
    message: str = ""
    details: dict[str, Any] = field(default_factory=dict)


EVENT_TYPES: dict[str, type[Event]] = {
    cls.TYPE: cls
    for cls in (
        StateChanged,
        MessageDelta,
        MessageCompleted,
        Progress,
        ToolStarted,
        ToolFinished,
        ApprovalRequested,
        ApprovalResolved,
        TurnFinished,
        NodeStarted,
        NodeFinished,
        NodeFailed,
        AgentChanged,
        ChildStarted,
        ChildFinished,
        ErrorEvent,
    )
}


def parse_event(frame: dict[str, Any]) -> Event:
    """A frame (websocket) or a row of `GET .../events/` as its typed event."""
    data = frame.get("data")
    if not isinstance(data, dict):
        data = {}
    cls = EVENT_TYPES.get(str(frame.get("type")), Event)
    envelope: dict[str, Any] = {
        "seq": frame.get("seq"),
        "type": str(frame.get("type", "")),
        "session": str(frame.get("session", "")),
        "ts": parse_time(frame.get("ts")),
        "data": data,
    }
    if cls is Event:
        return Event(**envelope)
    names = {f.name for f in fields(cls)} - set(envelope)
    values: dict[str, Any] = {}
    for key, value in data.items():
        name = cls.RENAMED.get(key, key)
        if name in names and value is not None:
            values[name] = value
    if cls is TurnFinished and isinstance(values.get("usage"), dict):
        usage = values["usage"]
        values["usage"] = TurnUsage(
            input_tokens=int(usage.get("input_tokens", 0)),
            output_tokens=int(usage.get("output_tokens", 0)),
            cost=Decimal(str(usage.get("cost") or 0)),
        )
    if cls is TurnFinished and "calls" in values:
        values["calls"] = TurnCalls.from_dict(values["calls"])
    return cls(**envelope, **values)
