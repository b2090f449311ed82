"""OpenAI's Chat Completions wire format: the request we accept, the objects we answer.

Pure Python (no Django): parsing a request body into a `ChatRequest`, and
building `chat.completion`, `chat.completion.chunk` and error objects exactly
as OpenAI spells them, so the official SDKs parse them unchanged. What the
platform adds travels in one extra top-level key, `agentplatform`, which the
SDKs keep (`completion.model_extra["agentplatform"]`).
"""

import json
import math
import re
import time
from dataclasses import dataclass, field
from typing import Any, Literal, NotRequired, TypedDict

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from llm.types import ClientToolJson, ModelOptions, ResponseFormatJson

# The roles of OpenAI's messages array. "developer" is the newer name for "system".
ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
# How many earlier messages a request may bring to seed a new session.
MAX_HISTORY = 200
# A response_format's JSON Schema is stored with the turn and sent with each model call.
MAX_SCHEMA_BYTES = 64 * 1024
_SCHEMA_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")

# What the platform does with each parameter of a request. Read here: `model`, `messages`,
# `stream`, `stream_options`, and the ones the model call honours (`SAMPLING`,
# `response_format`). Accepted and not used: identifiers and storage flags, which change
# nothing in the answer. Defaults some client libraries send: accepted at the default only.
# Anything else is refused by name (400, `param`), never silently dropped.
SAMPLING = ("temperature", "top_p", "max_tokens", "max_completion_tokens", "stop", "seed")
ACCEPTED = frozenset({"user", "store", "metadata", "safety_identifier", "prompt_cache_key"})
DEFAULTS: dict[str, tuple[Any, ...]] = {
    "n": (1,),
    "presence_penalty": (0,),
    "frequency_penalty": (0,),
    "logprobs": (False,),
    "top_logprobs": (0,),
    "logit_bias": ({},),
    "service_tier": ("auto", "default"),
    "modalities": (["text"],),
}
READ = frozenset(
    {
        "model",
        "messages",
        "stream",
        "stream_options",
        "response_format",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        *SAMPLING,
    }
)
# The client's own tools offered in one request.
MAX_CLIENT_TOOLS = 128
# Why a known parameter cannot be honoured, for its 400.
REFUSED = {
    "functions": "use 'tools' (the legacy functions are not supported)",
    "function_call": "use 'tools' (the legacy functions are not supported)",
    "n": "only n=1 is supported",
    "presence_penalty": "penalties cannot be set (only 0 is accepted)",
    "frequency_penalty": "penalties cannot be set (only 0 is accepted)",
    "logprobs": "log probabilities are not returned (only false is accepted)",
    "top_logprobs": "log probabilities are not returned (only 0 is accepted)",
    "logit_bias": "logit bias cannot be set",
    "service_tier": "only 'auto' or 'default' is accepted",
    "modalities": "only text is supported",
    "audio": "only text is supported",
    "prediction": "predicted outputs are not supported",
    "reasoning_effort": "the agent's model settings decide the reasoning effort",
    "verbosity": "the agent's model settings decide the verbosity",
    "web_search_options": "web search is not available; the agent's tools run on the platform",
}


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
class ToolResult:
    """A `tool` message: the client's result of one of its tools' calls."""

    call_id: str
    content: str


@dataclass(frozen=True)
class ChatRequest:
    model: str
    content: str  # the last user message: this turn's input
    history: list[HistoryItem] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False
    ignored_system_messages: int = 0
    # The settings the turn's model calls take (sampling, response_format), stored with
    # the turn's message; empty when the request sets none.
    options: ModelOptions = field(default_factory=lambda: ModelOptions())
    # The request's trailing tool messages: the turn that called the client's tools goes on.
    tool_results: list[ToolResult] = field(default_factory=list)

    @property
    def json_answer(self) -> bool:
        """The answer must be JSON (response_format): it is sent whole, once checked."""
        return "response_format" in self.options


def _no_nul(text: str, param: str) -> str:
    # PostgreSQL stores no NUL in text; refused here, the field named (record/json_limits.py).
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
       must be the user's, with text: it is the turn's input; or the `tool` messages
       that end the array are the results of the client's own tools' calls, which the
       turn that made them waits for.
    2. Earlier user and assistant texts become the history of a new session;
       system/developer messages are counted and ignored (the agent's own
       system prompt governs its tools and approvals); earlier tool results and
       assistant tool calls are dropped (the platform keeps its own).
    3. `tools`: the client's own function tools, offered beside the agent's.
    4. Every other parameter: honoured (the sampling ones, `response_format`: they go
       with the turn to its model calls), accepted without effect (`ACCEPTED`, a default
       in `DEFAULTS`), or refused naming it (`param`); null is the same as absent.
    """
    if not isinstance(body, dict):
        raise RequestInvalid("the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model.strip():
        raise RequestInvalid("'model' is required: the slug of an agent", "model")
    _no_nul(model, "model")
    _parameters_check(body)
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise RequestInvalid("'stream' must be a boolean", "stream")
    include_usage = _stream_options(body.get("stream_options"))
    options = _model_options(body)
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
    if last.get("role") == "tool":
        return ChatRequest(
            model=model,
            content="",
            stream=stream,
            include_usage=include_usage,
            ignored_system_messages=ignored,
            options=options,
            tool_results=_tool_results(messages),
        )
    last_text = _text(last.get("content"), f"messages[{len(messages) - 1}].content")
    if last.get("role") != "user" or not last_text or not last_text.strip():
        raise RequestInvalid(
            "the last message must be the user's, with text (the turn's input), or the "
            "results of your tools' calls (tool messages)",
            "messages",
        )
    return ChatRequest(
        model=model,
        content=last_text,
        history=history[:-1],
        stream=stream,
        include_usage=include_usage,
        ignored_system_messages=ignored,
        options=options,
    )


def _tool_results(messages: list[Any]) -> list[ToolResult]:
    """The `tool` messages that end the array, in order, each naming its call once."""
    results: list[ToolResult] = []
    at = len(messages) - 1
    while at >= 0 and isinstance(messages[at], dict) and messages[at].get("role") == "tool":
        message, param = messages[at], f"messages[{at}]"
        call_id = message.get("tool_call_id")
        if not isinstance(call_id, str) or not 0 < len(call_id) <= 100:
            raise RequestInvalid("a tool message needs its tool_call_id", f"{param}.tool_call_id")
        _no_nul(call_id, f"{param}.tool_call_id")
        text = _text(message.get("content"), f"{param}.content") or ""
        results.append(ToolResult(call_id=call_id, content=text))
        at -= 1
    results.reverse()
    ids = [r.call_id for r in results]
    if len(set(ids)) != len(ids):
        raise RequestInvalid("each tool_call_id may have one result", "messages")
    return results


def _client_tools(value: Any) -> list[ClientToolJson]:
    """OpenAI function tools: a name the wire formats accept, a JSON Schema for arguments."""
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > MAX_CLIENT_TOOLS:
        raise RequestInvalid(f"'tools' must be an array of at most {MAX_CLIENT_TOOLS}", "tools")
    tools: list[ClientToolJson] = []
    for i, tool in enumerate(value):
        param = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise RequestInvalid("only function tools are supported", f"{param}.type")
        spec = tool.get("function")
        if not isinstance(spec, dict):
            raise RequestInvalid("'function' must be an object", f"{param}.function")
        name = spec.get("name")
        if not isinstance(name, str) or not _SCHEMA_NAME.match(name):
            raise RequestInvalid(
                "a tool's name must be 1-64 letters, digits, underscores or dashes",
                f"{param}.function.name",
            )
        if any(t["name"] == name for t in tools):
            raise RequestInvalid(f"two tools are named '{name}'", f"{param}.function.name")
        description = spec.get("description") or ""
        if not isinstance(description, str):
            raise RequestInvalid("'description' must be a string", f"{param}.function.description")
        parameters = spec.get("parameters")
        if parameters is None:
            parameters = {"type": "object", "properties": {}}
        where = f"{param}.function.parameters"
        if not isinstance(parameters, dict):
            raise RequestInvalid("'parameters' must be a JSON Schema object", where)
        _schema_check(parameters, where)
        tools.append(
            {"name": name, "description": _no_nul(description, f"{param}.function.description"),
             "parameters": parameters}
        )  # fmt: skip
    return tools


def _schema_check(schema: dict[str, Any], where: str) -> None:
    """A JSON Schema stored with the turn and sent with each model call: draft 2020-12,
    within MAX_SCHEMA_BYTES, and no NUL (PostgreSQL keeps none in JSON text)."""
    text = json.dumps(schema, ensure_ascii=False)
    if len(text.encode()) > MAX_SCHEMA_BYTES:
        raise RequestInvalid(f"the schema is larger than {MAX_SCHEMA_BYTES} bytes", where)
    if "\\u0000" in text:
        raise RequestInvalid("the schema must not contain a NUL (\\u0000) character", where)
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        raise RequestInvalid(f"not a valid JSON Schema: {exc.message}", where) from None


def _parameters_check(body: dict[str, Any]) -> None:
    for name, value in body.items():
        if value is None or name in READ or name in ACCEPTED:
            continue
        if name in DEFAULTS:
            if any(value == d and type(value) is type(d) for d in DEFAULTS[name]) or (
                name in ("presence_penalty", "frequency_penalty") and value == 0
            ):
                continue
            raise RequestInvalid(f"'{name}' is not supported: {REFUSED[name]}", name)
        if name in REFUSED:
            raise RequestInvalid(f"'{name}' is not supported: {REFUSED[name]}", name)
        raise RequestInvalid(f"Unrecognized request argument supplied: {name}", name)
    metadata = body.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise RequestInvalid("'metadata' must be an object", "metadata")


def _stream_options(options: Any) -> bool:
    """`include_usage`; `include_obfuscation` is accepted (no padding is added anyway)."""
    if options is None:
        return False
    if not isinstance(options, dict):
        raise RequestInvalid("'stream_options' must be an object", "stream_options")
    for key, value in options.items():
        if key not in ("include_usage", "include_obfuscation"):
            raise RequestInvalid(f"Unrecognized stream option: {key}", f"stream_options.{key}")
        if value is not None and not isinstance(value, bool):
            raise RequestInvalid(f"'{key}' must be a boolean", f"stream_options.{key}")
    return options.get("include_usage") is True


def _number(body: dict[str, Any], name: str, low: float, high: float) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise RequestInvalid(f"'{name}' must be a number", name)
    if not low <= value <= high:
        raise RequestInvalid(f"'{name}' must be between {low:g} and {high:g}", name)
    return float(value)


def _integer(body: dict[str, Any], name: str, low: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestInvalid(f"'{name}' must be an integer", name)
    if low is not None and value < low:
        raise RequestInvalid(f"'{name}' must be at least {low}", name)
    return value


def _model_options(body: dict[str, Any]) -> ModelOptions:
    """The settings the turn's model calls take, as they are stored with the turn."""
    options = ModelOptions()
    temperature = _number(body, "temperature", 0, 2)
    if temperature is not None:
        options["temperature"] = temperature
    top_p = _number(body, "top_p", 0, 1)
    if top_p is not None:
        options["top_p"] = top_p
    limits = [
        n
        for n in (_integer(body, "max_tokens", 1), _integer(body, "max_completion_tokens", 1))
        if n is not None
    ]
    if limits:
        options["max_tokens"] = min(limits)
    seed = _integer(body, "seed")
    if seed is not None:
        options["seed"] = seed
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None:
        if not isinstance(stop, list) or len(stop) > 4:
            raise RequestInvalid("'stop' must be a string or an array of up to 4 strings", "stop")
        for i, item in enumerate(stop):
            if not isinstance(item, str) or not item:
                raise RequestInvalid("each stop sequence must be a non-empty string", f"stop[{i}]")
            _no_nul(item, f"stop[{i}]")
        if stop:
            options["stop"] = list(stop)
    answer = _response_format(body.get("response_format"))
    if answer is not None:
        options["response_format"] = answer
    tools = _client_tools(body.get("tools"))
    if tools:
        options["tools"] = tools
    choice = _tool_choice(body.get("tool_choice"))
    if choice is not None and choice != "auto":
        options["tool_choice"] = choice
    parallel = body.get("parallel_tool_calls")
    if parallel is not None:
        if not isinstance(parallel, bool):
            raise RequestInvalid("'parallel_tool_calls' must be a boolean", "parallel_tool_calls")
        if not parallel:
            options["parallel_tool_calls"] = False
    return options


def _tool_choice(value: Any) -> str | None:
    """`none`, `auto`, `required`, or `{"type": "function", "function": {"name"}}` (the name
    of one of the request's tools or of the agent's: checked once the agent is known)."""
    if value is None or value in ("none", "auto", "required"):
        return value
    param = "tool_choice"
    if isinstance(value, str):
        raise RequestInvalid("'tool_choice' must be none, auto, required or a function", param)
    function = value.get("function") if isinstance(value, dict) else None
    if (
        not isinstance(value, dict)
        or value.get("type") != "function"
        or not isinstance(function, dict)
    ):
        raise RequestInvalid(
            "'tool_choice' must be none, auto, required or "
            '{"type": "function", "function": {"name": ...}}',
            param,
        )
    name = function.get("name")
    if not isinstance(name, str) or not _SCHEMA_NAME.match(name):
        raise RequestInvalid(
            "the function's name is not a valid tool name", f"{param}.function.name"
        )
    return name


def _response_format(value: Any) -> ResponseFormatJson | None:
    """`text` (the default: None), `json_object`, or `json_schema` with a usable schema."""
    if value is None:
        return None
    param = "response_format"
    if not isinstance(value, dict):
        raise RequestInvalid("'response_format' must be an object", param)
    kind = value.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"schema": None, "name": "answer", "strict": False}
    if kind != "json_schema":
        raise RequestInvalid(
            f"response_format type {kind!r} is not supported: "
            "use 'text', 'json_object' or 'json_schema'",
            f"{param}.type",
        )
    spec = value.get("json_schema")
    if not isinstance(spec, dict):
        raise RequestInvalid("'json_schema' must be an object", f"{param}.json_schema")
    name = spec.get("name")
    if not isinstance(name, str) or not _SCHEMA_NAME.match(name):
        raise RequestInvalid(
            "'name' must be 1-64 letters, digits, underscores or dashes",
            f"{param}.json_schema.name",
        )
    strict = spec.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise RequestInvalid("'strict' must be a boolean", f"{param}.json_schema.strict")
    schema = spec.get("schema")
    where = f"{param}.json_schema.schema"
    if not isinstance(schema, dict):
        raise RequestInvalid("'schema' must be a JSON Schema object", where)
    _schema_check(schema, where)
    return {"schema": schema, "name": name, "strict": strict is True}


# Responses -----------------------------------------------------------------------------

FinishReason = Literal["stop", "length", "tool_calls"]


class WireFunction(TypedDict):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class WireToolCall(TypedDict):
    """A call of the client's own tools, as OpenAI's `tool_calls` spell it."""

    id: str
    type: Literal["function"]
    function: WireFunction


def wire_tool_call(call_id: str, name: str, arguments: Any) -> WireToolCall:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)},
    }


class Usage(TypedDict):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class Extension(TypedDict):
    """The `agentplatform` key: what an OpenAI object cannot say."""

    session_id: str
    # finished | awaiting_approval | awaiting_user | awaiting_tool_results | waiting_timer | timeout
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


def completion(
    *,
    id_: str,
    model: str,
    content: str,
    finish_reason: FinishReason,
    usage: Usage,
    extension: Extension,
    created: int | None = None,
    tool_calls: list[WireToolCall] | None = None,
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None}
    if tool_calls:
        # As OpenAI: the calls, and the text said with them (null when none was).
        message.update(content=content or None, tool_calls=tool_calls)
    return {
        "id": id_,
        "object": "chat.completion",
        "created": created or int(time.time()),
        "model": model,
        "system_fingerprint": None,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": finish_reason,
            }
        ],
        "usage": usage,
        "agentplatform": extension,
    }


@dataclass
class ChunkWriter:
    """The SSE events of one streamed answer; every chunk shares the id and creation time
    (`model` changes when a handoff gives the conversation to another agent)."""

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

    def tool_calls(self, calls: list[WireToolCall]) -> bytes:
        """Every call in one chunk, each whole (its `index` says which it is)."""
        return self.delta({"tool_calls": [{"index": i, **call} for i, call in enumerate(calls)]})

    def finish(self, finish_reason: FinishReason, extension: Extension) -> bytes:
        return self.delta({}, finish_reason, agentplatform=extension)

    def usage(self, usage: Usage) -> bytes:
        return self._chunk([], usage=usage)


def sse(data: Any) -> bytes:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


DONE = b"data: [DONE]\n\n"
# An SSE comment: keeps proxies from closing a quiet stream; clients skip it.
KEEPALIVE = b": keep-alive\n\n"
