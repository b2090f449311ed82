"""Provider-neutral chat types. Nothing above `llm/` sees a wire format."""

from dataclasses import dataclass, field
from typing import Any, Literal

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
class ChatRequest:
    messages: tuple[ChatMessage, ...]
    tools: tuple[ToolSpec, ...] = ()
    tool_choice: Literal["auto", "none", "required"] | str = "auto"
    temperature: float | None = None
    max_tokens: int | None = None
    # A JSON Schema the answer must satisfy: sent as the wire's structured output where it
    # has one (OpenAI's response_format); the caller validates the answer either way.
    response_schema: dict[str, Any] | None = None
    # Agent-level configuration an adapter may need (the rules table, for one).
    agent_config: dict[str, Any] = field(default_factory=dict)


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
