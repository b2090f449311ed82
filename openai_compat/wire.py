"""OpenAI's Chat Completions wire format: the request we accept, the objects we answer.

Pure Python (no Django): parsing a request body into a `ChatRequest`, and
building `chat.completion`, `chat.completion.chunk` and error objects exactly
as OpenAI spells them, so the official SDKs parse them unchanged. What the
platform adds travels in one extra top-level key, `agentplatform`, which the
SDKs keep (`completion.model_extra["agentplatform"]`).
"""

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal, NotRequired, TypedDict

# The roles of OpenAI's messages array. "developer" is the newer name for "system".
ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
# How many earlier messages a request may bring to seed a new session.
MAX_HISTORY = 200

# Sampling and formatting parameters a client library sends by default; the
# agent's model settings decide them, so they are accepted and ignored.
IGNORED_PARAMETERS = frozenset(
    {
        "temperature",
        "top_p",
        "max_tokens",
        "max_completion_tokens",
        "presence_penalty",
        "frequency_penalty",
        "logit_bias",
        "logprobs",
        "top_logprobs",
        "seed",
        "stop",
        "user",
        "metadata",
        "store",
        "service_tier",
        "parallel_tool_calls",
        "reasoning_effort",
        "response_format",
        "modalities",
        "prediction",
        "audio",
        "web_search_options",
        "verbosity",
        "prompt_cache_key",
        "safety_identifier",
    }
)


class RequestInvalid(ValueError):
    """The body is not a chat completion request we can serve; `param` names the field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


@dataclass(frozen=True)
class HistoryItem:
    role: Literal["user", "assistant"]
    content: str


@dataclass(frozen=True)
class ChatRequest:
    model: str
    content: str  # the last user message: this turn's input
    history: list[HistoryItem] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False
    ignored_system_messages: int = 0


def _no_nul(text: str, param: str) -> str:
    # PostgreSQL stores no NUL in text; refused here, the field named (sessions/json_limits.py).
    if "\x00" in text:
        raise RequestInvalid("text must not contain a NUL (\\u0000) character", param)
    return text


def _text(content: Any, param: str) -> str | None:
    """A message's text: a string, or the text parts of a content array; None for null."""
    if content is None:
        return None
    if isinstance(content, str):
        return _no_nul(content, param)
    if isinstance(content, list):
        texts = []
        for i, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text":
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise RequestInvalid(
                    f"only text content parts are supported; got {kind!r}", f"{param}[{i}]"
                )
            text = part.get("text")
            if not isinstance(text, str):
                raise RequestInvalid("a text part needs a string 'text'", f"{param}[{i}].text")
            texts.append(_no_nul(text, f"{param}[{i}].text"))
        return "".join(texts)
    raise RequestInvalid("content must be a string, an array of text parts or null", param)


def chat_request_parse(body: Any) -> ChatRequest:
    """Check a request body and read what the platform uses from it.

    1. `model` and a non-empty `messages` array are required; the last message
       must be the user's, with text: it is the turn's input.
    2. Earlier user and assistant texts become the history of a new session;
       system/developer messages are counted and ignored (the agent's own
       system prompt governs its tools and approvals); tool results are the
       platform's own business and are dropped, as are assistant tool calls.
    3. Client-side tools (`tools`, `functions`), `n` > 1 and unknown types are refused.
    """
    if not isinstance(body, dict):
        raise RequestInvalid("the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model.strip():
        raise RequestInvalid("'model' is required: the slug of an agent", "model")
    _no_nul(model, "model")
    for name in ("tools", "functions"):
        if body.get(name):
            raise RequestInvalid(
                f"'{name}' is not supported: the agent's tools run on the platform", name
            )
    n = body.get("n", 1)
    if n not in (1, None):
        raise RequestInvalid("only n=1 is supported", "n")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise RequestInvalid("'stream' must be a boolean", "stream")
    options = body.get("stream_options")
    include_usage = False
    if options is not None:
        if not isinstance(options, dict):
            raise RequestInvalid("'stream_options' must be an object", "stream_options")
        flag = options.get("include_usage", False)
        if not isinstance(flag, bool):
            raise RequestInvalid(
                "'include_usage' must be a boolean", "stream_options.include_usage"
            )
        include_usage = flag
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestInvalid("'messages' must be a non-empty array", "messages")
    if len(messages) > MAX_HISTORY + 1:
        raise RequestInvalid(f"at most {MAX_HISTORY + 1} messages are accepted", "messages")
    history: list[HistoryItem] = []
    ignored = 0
    for i, message in enumerate(messages):
        param = f"messages[{i}]"
        if not isinstance(message, dict):
            raise RequestInvalid("each message must be an object", param)
        role = message.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise RequestInvalid(f"unknown role {role!r}", f"{param}.role")
        text = _text(message.get("content"), f"{param}.content")
        if role in ("system", "developer"):
            ignored += 1
        elif role == "user" and text:
            history.append(HistoryItem(role="user", content=text))
        elif role == "assistant" and text:
            history.append(HistoryItem(role="assistant", content=text))
    last = messages[-1]
    last_text = _text(last.get("content"), f"messages[{len(messages) - 1}].content")
    if last.get("role") != "user" or not last_text or not last_text.strip():
        raise RequestInvalid(
            "the last message must be the user's, with text: it is the turn's input", "messages"
        )
    return ChatRequest(
        model=model,
        content=last_text,
        history=history[:-1],
        stream=stream,
        include_usage=include_usage,
        ignored_system_messages=ignored,
    )


# Responses -----------------------------------------------------------------------------

FinishReason = Literal["stop", "length"]


class Usage(TypedDict):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class Extension(TypedDict):
    """The `agentplatform` key: what an OpenAI object cannot say."""

    session_id: str
    # finished | awaiting_approval | awaiting_user | waiting_timer | timeout
    status: str
    stop_reason: NotRequired[str]  # the turn's stop_reason when it finished
    approval_id: NotRequired[str]
    question: NotRequired[str]
    options: NotRequired[list[str]]


class ErrorObject(TypedDict):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorBody(TypedDict):
    error: ErrorObject


def error_body(message: str, type_: str, code: str | None, param: str | None = None) -> ErrorBody:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def usage_of(prompt_tokens: int, completion_tokens: int) -> Usage:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex}"


def completion(
    *,
    id_: str,
    model: str,
    content: str,
    finish_reason: FinishReason,
    usage: Usage,
    extension: Extension,
    created: int | None = None,
) -> dict[str, Any]:
    return {
        "id": id_,
        "object": "chat.completion",
        "created": created or int(time.time()),
        "model": model,
        "system_fingerprint": None,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content, "refusal": None},
                "logprobs": None,
                "finish_reason": finish_reason,
            }
        ],
        "usage": usage,
        "agentplatform": extension,
    }


@dataclass(frozen=True)
class ChunkWriter:
    """The SSE events of one streamed answer; every chunk shares the id and creation time."""

    id_: str
    model: str
    include_usage: bool
    created: int = field(default_factory=lambda: int(time.time()))

    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        chunk: dict[str, Any] = {
            "id": self.id_,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
            "choices": choices,
        }
        if self.include_usage:
            chunk["usage"] = None  # as OpenAI: null on every chunk but the last
        chunk.update(extra)
        return sse(chunk)

    def delta(self, delta: dict[str, Any], finish_reason: str | None = None, **extra: Any) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return self._chunk([choice], **extra)

    def role(self) -> bytes:
        return self.delta({"role": "assistant", "content": ""})

    def content(self, text: str) -> bytes:
        return self.delta({"content": text})

    def finish(self, finish_reason: FinishReason, extension: Extension) -> bytes:
        return self.delta({}, finish_reason, agentplatform=extension)

    def usage(self, usage: Usage) -> bytes:
        return self._chunk([], usage=usage)


def sse(data: Any) -> bytes:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


DONE = b"data: [DONE]\n\n"
# An SSE comment: keeps proxies from closing a quiet stream; clients skip it.
KEEPALIVE = b": keep-alive\n\n"
