"""The events of a session's stream: their types and the shape of each payload.

One place names every type string the engine, the publisher, the consumer and
the admin use; the wire format (type strings, payload keys) is the public
contract in DESIGN.md. Payloads are TypedDicts: checked by mypy where they are
built, and by a test against what the suite writes, never at run time (the
step path stays as cheap as a tuple).
"""

from enum import StrEnum
from typing import Any, NamedTuple, NotRequired, TypedDict


class EventType(StrEnum):
    STATE_CHANGED = "state.changed"
    MESSAGE_DELTA = "message.delta"
    MESSAGE_COMPLETED = "message.completed"
    PROGRESS = "progress"
    TOOL_STARTED = "tool.started"
    TOOL_FINISHED = "tool.finished"
    APPROVAL_REQUESTED = "approval.requested"
    APPROVAL_RESOLVED = "approval.resolved"
    TURN_FINISHED = "turn.finished"
    ERROR = "error"
    # A workflow run's nodes (workflows/, engine/phases/node.py).
    NODE_STARTED = "node.started"
    NODE_FINISHED = "node.finished"
    NODE_FAILED = "node.failed"


class StopReason(StrEnum):
    """Why a turn ended (`turn.finished` `stop_reason`)."""

    ANSWER = "answer"
    MAX_ITERATIONS = "max_iterations"
    TURN_TIMEOUT = "turn_timeout"
    # Loop guards (engine/gates/guards.py).
    REPEATED_CALL = "repeated_call"
    NO_NEW_INFORMATION = "no_new_information"
    CYCLE = "cycle"
    MODEL_UNAVAILABLE = "model_unavailable"
    MODEL_REFUSED = "model_refused"
    CANCELLED = "cancelled"
    # A budget of the agent or the owner (billing/budgets.py) does not cover another model call.
    BUDGET_EXCEEDED = "budget_exceeded"
    INTERRUPTED = "interrupted"
    ERROR = "error"
    # Tool calls the owner's credit points could not pay for, twice in a turn.
    INSUFFICIENT_CREDITS = "insufficient_credits"
    OPERATOR = "operator"  # an operator ended the turn with their own answer


# Every payload may carry `truncated`: the fields cut so the event fits EVENT_MAX_BYTES,
# with their original sizes (sessions/event_limits.py).
# "from" is a keyword: the functional form keeps the wire key.
# trace_id: the turn's OpenTelemetry trace, when traces are on (observability/tracing.py).
StateChanged = TypedDict(
    "StateChanged",
    {
        "from": str,
        "to": str,
        "trigger": str,
        "reason": str,
        "trace_id": NotRequired[str],
        "truncated": NotRequired[dict[str, int]],
    },
)


class MessageDelta(TypedDict):
    text: str
    turn: int
    truncated: NotRequired[dict[str, int]]  # fields cut to fit EVENT_MAX_BYTES


class MessageCompleted(TypedDict):
    seq: int
    role: str
    content: str
    turn: int
    tool_calls: NotRequired[list[dict[str, Any]]]
    tool_call_id: NotRequired[str]
    name: NotRequired[str]
    truncated: NotRequired[dict[str, int]]  # fields cut to fit EVENT_MAX_BYTES


class Progress(TypedDict):
    stage: str  # preparing_tool | answer_discarded | credits_low | degradation | question
    turn: int
    tool: NotRequired[str]
    level: NotRequired[int]  # stage degradation: the session's new level (0-3)
    # credits_low: the owner's balance dropped below its low-water mark.
    kind: NotRequired[str]  # "credits.low"
    balance: NotRequired[int]
    low_water_mark: NotRequired[int]
    # stage "question" (the model's ask_user): what the user is asked; their next message answers.
    question: NotRequired[str]
    options: NotRequired[list[str]]
    call_id: NotRequired[str]
    deadline: NotRequired[str | None]
    truncated: NotRequired[dict[str, int]]  # fields cut to fit EVENT_MAX_BYTES


class ToolStarted(TypedDict):
    call_id: str
    tool: str
    input: Any  # what the model sent; not always an object
    turn: int
    truncated: NotRequired[dict[str, int]]  # fields cut to fit EVENT_MAX_BYTES


class ToolFinished(TypedDict):
    call_id: str
    tool: str
    status: str
    error: str
    turn: int
    # Only for a call that ran (a call closed by the end of its turn has none).
    elapsed_ms: NotRequired[int]
    output: NotRequired[Any]
    cached: NotRequired[bool]
    coercions: NotRequired[list[Any]]
    probed: NotRequired[str | None]
    truncated: NotRequired[dict[str, int]]  # fields cut to fit EVENT_MAX_BYTES


class ApprovalRequested(TypedDict):
    approval_id: str
    tool: str
    arguments: dict[str, Any]
    risk_level: int
    deadline: str
    truncated: NotRequired[dict[str, int]]  # fields cut to fit EVENT_MAX_BYTES


class ApprovalResolved(TypedDict):
    approval_id: str
    outcome: str  # approved | rejected | expired | escalated | cancelled | withdrawn
    by: str
    comment: str
    # A changed decision: the one it replaces (approved | rejected).
    previous: NotRequired[str]
    truncated: NotRequired[dict[str, int]]  # fields cut to fit EVENT_MAX_BYTES


class UsageTotals(TypedDict):
    input_tokens: int
    output_tokens: int
    cost: str  # a decimal, as a string


class TurnFinished(TypedDict):
    turn: int
    stop_reason: str
    iterations: int
    usage: UsageTotals
    reason: NotRequired[str]
    trace_id: NotRequired[str]  # the turn's OpenTelemetry trace, when traces are on
    # A workflow run's result (the state key its definition names as `result`).
    result: NotRequired[Any]
    truncated: NotRequired[dict[str, int]]  # fields cut to fit EVENT_MAX_BYTES


class NodeStarted(TypedDict):
    node: str
    kind: str
    visit: int
    # What the node's expressions read, evaluated (a map's items, a tool node's arguments).
    input: NotRequired[Any]
    truncated: NotRequired[dict[str, int]]  # fields cut to fit EVENT_MAX_BYTES


class NodeFinished(TypedDict):
    node: str
    output: Any
    # Where the run goes next (a node id, or "end").
    next: NotRequired[str]
    truncated: NotRequired[dict[str, int]]  # fields cut to fit EVENT_MAX_BYTES


class NodeFailed(TypedDict):
    node: str
    error: str
    truncated: NotRequired[dict[str, int]]  # fields cut to fit EVENT_MAX_BYTES


class Error(TypedDict):
    code: str
    message: str
    # Only on frames the websocket sends about the socket itself (never persisted).
    details: NotRequired[dict[str, Any]]
    truncated: NotRequired[dict[str, int]]  # fields cut to fit EVENT_MAX_BYTES


Payload = (
    StateChanged
    | MessageDelta
    | MessageCompleted
    | Progress
    | ToolStarted
    | ToolFinished
    | ApprovalRequested
    | ApprovalResolved
    | TurnFinished
    | NodeStarted
    | NodeFinished
    | NodeFailed
    | Error
)

PAYLOADS: dict[EventType, type] = {
    EventType.STATE_CHANGED: StateChanged,
    EventType.MESSAGE_DELTA: MessageDelta,
    EventType.MESSAGE_COMPLETED: MessageCompleted,
    EventType.PROGRESS: Progress,
    EventType.TOOL_STARTED: ToolStarted,
    EventType.TOOL_FINISHED: ToolFinished,
    EventType.APPROVAL_REQUESTED: ApprovalRequested,
    EventType.APPROVAL_RESOLVED: ApprovalResolved,
    EventType.TURN_FINISHED: TurnFinished,
    EventType.NODE_STARTED: NodeStarted,
    EventType.NODE_FINISHED: NodeFinished,
    EventType.NODE_FAILED: NodeFailed,
    EventType.ERROR: Error,
}


class EventSpec(NamedTuple):
    """An event a step writes (or a frame sends): its type and its payload."""

    type: EventType
    data: Payload
