"""Provider-neutral chat types. Nothing above `llm/` sees a wire format."""

from dataclasses import dataclass, field
from typing import Any, Literal, TypedDict

Role = Literal["system", "user", "assistant", "tool"]


@dataclass(frozen=True)
class ToolCallRequest:
    """A tool call the model asked for, with its arguments already parsed."""

    id: str
    name: str
    arguments: dict[str, Any]
    # Set when the arguments were not valid JSON; the tool layer feeds it back.
    arguments_error: str | None = None


@dataclass(frozen=True)
class ChatMessage:
    role: Role
    content: str = ""
    tool_calls: tuple[ToolCallRequest, ...] = ()
    tool_call_id: str = ""
    name: str = ""
    # The structured tool result behind `content`; only the offline rules model reads it.
    data: Any = None


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(frozen=True)
class ResponseFormat:
    """The answer must be JSON: any JSON object (`schema` None, OpenAI's `json_object`), or
    a value valid against `schema`. Sent as the wire's structured output where it has one
    (OpenAI's response_format); the caller validates the answer either way."""

    schema: dict[str, Any] | None = None
    name: str = "answer"  # the schema's name on the wire (a client's own, when it gave one)
    strict: bool = False  # OpenAI's strict schema mode (the client's choice)


@dataclass(frozen=True)
class ChatRequest:
    messages: tuple[ChatMessage, ...]
    tools: tuple[ToolSpec, ...] = ()
    # "auto", "none", "required" (some tool), or one tool's name (that tool).
    tool_choice: Literal["auto", "none", "required"] | str = "auto"
    # False: at most one tool call in the reply; None leaves the wire's default (several).
    parallel_tool_calls: bool | None = None
    temperature: float | None = None
    max_tokens: int | None = None
    # Sampling a client may set (the OpenAI-compatible endpoint); an adapter sends what its
    # wire format has (Anthropic has no seed).
    top_p: float | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None
    response_format: ResponseFormat | None = None
    # Agent-level configuration an adapter may need (the rules table, for one).
    agent_config: dict[str, Any] = field(default_factory=dict)


class ResponseFormatJson(TypedDict):
    schema: dict[str, Any] | None
    name: str
    strict: bool


class ClientToolJson(TypedDict):
    name: str
    description: str
    parameters: dict[str, Any]


class ModelOptions(TypedDict, total=False):
    """A client's settings for the model calls of one turn, as JSON: stored with the turn's
    message (Message.turn_options) by the OpenAI-compatible endpoint, read by every model
    step of the turn (engine/gates/turn_options.py)."""

    temperature: float
    top_p: float
    max_tokens: int
    stop: list[str]
    seed: int
    response_format: ResponseFormatJson
    # The client's own tools, offered beside the agent's: the client runs them.
    tools: list[ClientToolJson]
    # "none", "required" or a tool's name ("auto" is not stored); a forced choice holds
    # until the turn's first tool call (engine/gates/turn_options.py).
    tool_choice: str
    parallel_tool_calls: bool


# Stream events -------------------------------------------------------------


@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class ToolCallStarted:
    index: int
    id: str
    name: str


@dataclass(frozen=True)
class ToolCallArgumentsDelta:
    index: int
    fragment: str


@dataclass(frozen=True)
class ToolCallFinished:
    index: int
    call: ToolCallRequest


@dataclass(frozen=True)
class Usage:
    input_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class Finish:
    reason: Literal["stop", "tool_calls", "length", "error"] | str


StreamEvent = (
    TextDelta | ToolCallStarted | ToolCallArgumentsDelta | ToolCallFinished | Usage | Finish
)


@dataclass
class ChatResponse:
    """A complete answer: text, tool calls, usage and why it stopped."""

    text: str = ""
    tool_calls: list[ToolCallRequest] = field(default_factory=list)
    usage: Usage | None = None
    finish_reason: str = "stop"
