"""The events of a session's stream: their types and the shape of each payload.

One place names every type string the engine, the publisher, the consumer and
the admin use; the wire format (type strings, payload keys) is the public
contract in DESIGN.md. Payloads are TypedDicts: checked by mypy where they are
built, and by a test against what the suite writes, never at run time (the
step path stays as cheap as a tuple).
"""

from collections.abc import Iterable
from enum import StrEnum
from typing import Any, NamedTuple, NotRequired, TypedDict, cast


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
    # Agents together: a handoff, and the child sessions of agent.<slug> calls.
    AGENT_CHANGED = "agent.changed"
    CHILD_STARTED = "child.started"
    CHILD_FINISHED = "child.finished"


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
    # The client asked for a JSON answer (response_format) and the model's is not valid
    # for it, after one repair (engine/phases/model.py answer_conform).
    INVALID_OUTPUT = "invalid_output"
    CANCELLED = "cancelled"
    # A budget of the agent or the owner (billing/budgets.py) does not cover another model call.
    BUDGET_EXCEEDED = "budget_exceeded"
    INTERRUPTED = "interrupted"
    ERROR = "error"
    # Tool calls the owner's credit points could not pay for, twice in a turn.
    INSUFFICIENT_CREDITS = "insufficient_credits"
    OPERATOR = "operator"  # an operator ended the turn with their own answer
    # The client did not send its own tools' results before OPENAI_CLIENT_TOOLS_WAIT_S:
    # nobody listens, so the turn ends without calling the model again.
    EXPIRED = "expired"


class TurnOutcome(StrEnum):
    """How a turn went (`turn.finished` `outcome`, DESIGN.md "A turn's outcome")."""

    OK = "ok"  # every tool call ran and succeeded (or there were none)
    TOOL_FAILURES = "tool_failures"  # a call failed, was rejected, expired or was unpaid
    STOPPED = "stopped"  # a guard, a budget, the credits, a cancel or an operator ended it
    ERROR = "error"  # the run failed, or no model could answer


# Stop reasons of a turn that failed: the run stopped in error, or the user got the busy
# message because no model answered (or the endpoint refused the request).
ERROR_STOPS = frozenset({StopReason.ERROR, StopReason.MODEL_UNAVAILABLE, StopReason.MODEL_REFUSED})


class CallCounts(TypedDict):
    """A turn's tool calls by how they ended (`turn.finished` `calls`)."""

    ok: int  # ran and succeeded
    failed: int  # ran and failed or timed out, or was held back (rate limit, degradation)
    rejected: int  # an approver rejected it, or the turn ended before it ran
    expired: int  # no approver decided before its deadline
    unpaid: int  # the owner's credit points could not pay for it


CALL_KINDS = ("ok", "failed", "rejected", "expired", "unpaid")


def call_kind(status: str, refusal: str = "") -> str:
    """The key of `CallCounts` a tool call counts under, from its stored status and, for a
    call that did not run, why (ToolCall.refusal: rejected, expired, unpaid)."""
    if status == "success":
        return "ok"
    if status == "rejected":
        return refusal if refusal in ("expired", "unpaid") else "rejected"
    return "failed"  # failed, timeout; an open call (executing) counts as not done


def call_counts(calls: Iterable[tuple[str, str]]) -> CallCounts:
    """Counts of (status, refusal) pairs; calls still executing are left out."""
    counts: dict[str, int] = dict.fromkeys(CALL_KINDS, 0)
    for status, refusal in calls:
        if status != "executing":
            counts[call_kind(status, refusal)] += 1
    return cast(CallCounts, counts)


def turn_outcome(stop_reason: str, calls: CallCounts) -> TurnOutcome:
    """The contract's outcome: an error first, then a stop, then any call that did not
    succeed."""
    if stop_reason in ERROR_STOPS:
        return TurnOutcome.ERROR
    if stop_reason != StopReason.ANSWER:
        return TurnOutcome.STOPPED
    if calls["failed"] or calls["rejected"] or calls["expired"] or calls["unpaid"]:
        return TurnOutcome.TOOL_FAILURES
    return TurnOutcome.OK


# Every payload may carry `truncated`: the fields cut so the event fits EVENT_MAX_BYTES,
# with their original sizes (record/event_limits.py).
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


class ClientCall(TypedDict):
    call_id: str
    tool: str
    input: Any  # what the model sent; not always an object


class Progress(TypedDict):
    # preparing_tool | answer_discarded | credits_low | degradation | question | client_tools
    stage: str
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
    # stage "client_tools": the calls the client runs (the OpenAI-compatible request's tools);
    # its next request brings their results.
    calls: NotRequired[list[ClientCall]]
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
    # Only for a call that ran with an approver's edited arguments: what ran (`input`)
    # and what the model had proposed (`proposed_input`).
    input: NotRequired[Any]
    proposed_input: NotRequired[Any]
    # Only for a call that did not run: rejected | expired | unpaid.
    refusal: NotRequired[str]
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
    outcome: str  # a TurnOutcome
    calls: CallCounts
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


AgentChanged = TypedDict(
    "AgentChanged",
    {
        "from": str,
        "to": str,
        "reason": str,
        "truncated": NotRequired[dict[str, int]],
    },
)


class ChildStarted(TypedDict):
    call_id: str
    session: str  # the child session's id: its own events are on its own stream
    agent: str
    truncated: NotRequired[dict[str, int]]  # fields cut to fit EVENT_MAX_BYTES


class ChildFinished(TypedDict):
    call_id: str
    session: str
    agent: str
    state: str  # finished | error | cancelled
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
    | AgentChanged
    | ChildStarted
    | ChildFinished
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
    EventType.AGENT_CHANGED: AgentChanged,
    EventType.CHILD_STARTED: ChildStarted,
    EventType.CHILD_FINISHED: ChildFinished,
    EventType.ERROR: Error,
}


class EventSpec(NamedTuple):
    """An event a step writes (or a frame sends): its type and its payload."""

    type: EventType
    data: Payload
