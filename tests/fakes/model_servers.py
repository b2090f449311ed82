"""Real HTTP model servers for tests: OpenAI Chat Completions and Anthropic Messages.

Each `FakeModelServer` is a stdlib `ThreadingHTTPServer` on 127.0.0.1 (a free
port) running in a background thread. It answers from a **script**: a queue of
`Reply` objects (or callables that build one from the recorded request), one
per request, and records every request (path, headers, JSON body).

A `Reply` describes an answer in provider-neutral terms (text, tool calls,
usage) plus how to deliver it badly (HTTP errors, a stream cut or stalled, no
terminal event, junk chunks, invalid UTF-8, byte-level write splits, delays).
The server renders it in its own wire format, streamed (SSE, written event by
event with a flush, `Connection: close` or chunked encoding) or as one JSON
body, depending on the request's `"stream"` flag.

    server.script(Reply(text="Hello"), Reply(status=429, headers={"Retry-After": "2"}))
    ... run the code under test against server.base_url ...
    assert server.requests[0].body["stream"] is True

Like the real APIs, a server refuses (400) a request its wire's schema refuses
(`validate_request`: roles, tool definitions, tool_choice, every tool call answered by a
result with its id). And it is **strict** (`server.strict`, on by default): a scripted
reply may only do what a real model could with that request. A reply that calls a tool
the request did not offer, calls one under `tool_choice` "none", or ignores a forced
`tool_choice` is not sent: the server answers 400 and records the reason in
`server.violations`, which the fixtures (tests/fakes/fixtures.py) assert is empty at
teardown. A test of how the platform survives a model calling an unknown tool turns it
off (`server.strict = False`) and says so.
"""

import contextlib
import json
import re
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

Api = Literal["openai", "anthropic"]

# How long a "hang" or "stall" reply holds the socket at most (reset() releases it sooner).
HOLD_MAX_S = 30.0


@dataclass
class Call:
    """One scripted tool call. `arguments` is a dict (sent as JSON) or raw text (may be invalid JSON)."""

    name: str
    arguments: dict[str, Any] | str = field(default_factory=dict)
    id: str | None = None
    # Where the argument text is cut into fragments: a chunk size in characters,
    # or explicit character offsets (cut mid-token wherever you like).
    splits: int | Sequence[int] = 8

    def arguments_text(self) -> str:
        if isinstance(self.arguments, str):
            return self.arguments
        return json.dumps(self.arguments, ensure_ascii=False)


@dataclass
class Reply:
    """One scripted answer. Defaults give a well-formed streamed answer."""

    text: str = ""
    calls: Sequence[Call] = ()
    # Text chunking: None = word by word, an int = chunk size, a list = offsets.
    text_splits: int | Sequence[int] | None = None
    # OpenAI only: send the calls' fragments round-robin (interleaved by index).
    interleave: bool = False
    # OpenAI only: how fragments carry `index`: "normal"; "omit" (no index at all, as
    # Gemini's compatible API does); "zero" (every call index 0, as Ollama does).
    index_mode: Literal["normal", "omit", "zero"] = "normal"
    usage: tuple[int, int] | None = (10, 5)
    finish_reason: str | None = None
    # --- delivery -------------------------------------------------------------
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    error_message: str | None = None
    error_type: str | None = None
    echo_key: bool = False  # put the received API key into the error message (a careless provider)
    hang: bool = False  # read the request, then never send a byte
    drop: bool = False  # read the request, then close the connection without an answer
    stall_after: int | None = None  # send headers and N events, then hold the socket silently
    cut_after: int | None = (
        None  # send N events (streamed) or N bytes (JSON), then drop the connection
    )
    no_done: bool = False  # omit `data: [DONE]` / `message_stop` and end the body normally
    bad_json_at: int | None = None  # insert an event whose data is not JSON before event N
    insert: Sequence[tuple[int, bytes]] = ()  # raw bytes inserted before event N
    error_event_at: int | None = None  # after N events send an in-stream error, then end
    error_event: dict[str, Any] | None = None
    unknown_events: bool = False  # sprinkle unknown event types / block types (Anthropic) and pings
    first_delay_s: float = 0.0  # after the headers, before the first event
    delay_s: float = 0.0  # between events
    write_size: int | None = None  # write the body in pieces of this many bytes
    split_multibyte: bool = False  # cut each write inside its first multi-byte UTF-8 character
    write_pause_s: float = 0.003  # pause between split writes, so they arrive as separate reads
    chunked: bool = False  # Transfer-Encoding: chunked instead of Connection: close framing
    raw_body: bytes | None = None  # send exactly this body (status/headers still apply)
    events: Sequence[bytes] | None = None  # send exactly these SSE events

    @property
    def output_tokens(self) -> int:
        return self.usage[1] if self.usage else 0

    @property
    def input_tokens(self) -> int:
        return self.usage[0] if self.usage else 0


ReplyLike = Reply | Callable[["Recorded"], Reply]


@dataclass
class Recorded:
    """One request the server received."""

    api: str
    method: str
    path: str
    headers: dict[str, str]  # lower-cased names
    raw: bytes
    body: Any
    at: float

    @property
    def stream(self) -> bool:
        return bool(isinstance(self.body, dict) and self.body.get("stream"))

    @property
    def messages(self) -> list[dict[str, Any]]:
        return list(self.body.get("messages") or []) if isinstance(self.body, dict) else []

    def text(self) -> str:
        """Every message's text, joined (to look for a correction, a tool result...)."""
        return json.dumps(self.body, ensure_ascii=False)

    def tool_results(self) -> list[Any]:
        """Tool results the model was shown, oldest first: parsed as JSON where they are
        JSON, else the text the platform rendered for the model."""
        found: list[Any] = []
        for message in self.messages:
            content = message.get("content")
            if message.get("role") == "tool":
                found.append(_maybe_json(content))
            elif isinstance(content, list):  # Anthropic tool_result blocks
                for block in content:
                    if isinstance(block, dict) and block.get("type") == "tool_result":
                        inner = block.get("content")
                        if isinstance(inner, list):
                            inner = "".join(b.get("text", "") for b in inner if isinstance(b, dict))
                        found.append(_maybe_json(inner))
            elif (
                message.get("role") == "user"
                and isinstance(content, str)
                and content.startswith("<tool_result ")
                and content.endswith("\n</tool_result>")
            ):
                # prompt_tools: the frame's first and last lines around the result
                found.append(_maybe_json(content.split("\n", 1)[1].rsplit("\n", 1)[0]))
        return found

    def last_tool_result(self) -> Any:
        results = self.tool_results()
        return results[-1] if results else None


def _maybe_json(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError:
        return value


def _pieces(text: str, splits: int | Sequence[int] | None) -> list[str]:
    if not text:
        return []
    if splits is None:
        return re.findall(r"\S+\s*|\s+", text)
    if isinstance(splits, int):
        size = max(splits, 1)
        return [text[i : i + size] for i in range(0, len(text), size)]
    cuts = sorted({c for c in splits if 0 < c < len(text)})
    bounds = [0, *cuts, len(text)]
    return [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


def sse(data: Any, event: str | None = None) -> bytes:
    """One Server-Sent Event; `data` is JSON-encoded unless it is already text."""
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    head = f"event: {event}\n" if event else ""
    return (head + f"data: {payload}\n\n").encode()


def invalid_utf8_event(api: Api, index: int = 0) -> bytes:
    """A text delta whose JSON string holds bytes that are not UTF-8."""
    if api == "openai":
        return b'data: {"id":"chatcmpl-fake","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"bad \xff\xfe bytes "},"finish_reason":null}]}\n\n'
    return (
        b'event: content_block_delta\ndata: {"type":"content_block_delta","index":'
        + str(index).encode()
        + b',"delta":{"type":"text_delta","text":"bad \xff\xfe bytes "}}\n\n'
    )


# Rendering -------------------------------------------------------------------


def _call_id(api: str, call: Call, index: int) -> str:
    if call.id:
        return call.id
    return f"call_fake_{index}" if api == "openai" else f"toolu_fake_{index}"


def openai_events(reply: Reply, model: str, include_usage: bool) -> list[bytes]:
    base = {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
    }

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        return sse(
            {
                **base,
                "choices": [
                    {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
                ],
            }
        )

    events = [chunk({"role": "assistant", "content": "" if not reply.calls else None})]
    events += [chunk({"content": piece}) for piece in _pieces(reply.text, reply.text_splits)]
    per_call: list[list[bytes]] = []

    def numbered(index: int, fragment: dict[str, Any]) -> dict[str, Any]:
        if reply.index_mode == "omit":
            return fragment
        return {"index": 0 if reply.index_mode == "zero" else index, **fragment}

    for index, call in enumerate(reply.calls):
        first = numbered(
            index,
            {
                "id": _call_id("openai", call, index),
                "type": "function",
                "function": {"name": call.name, "arguments": ""},
            },
        )
        fragments = [chunk({"tool_calls": [first]})]
        fragments += [
            chunk({"tool_calls": [numbered(index, {"function": {"arguments": piece}})]})
            for piece in _pieces(call.arguments_text(), call.splits)
        ]
        per_call.append(fragments)
    if reply.interleave:
        longest = max((len(f) for f in per_call), default=0)
        events += [f[i] for i in range(longest) for f in per_call if i < len(f)]
    else:
        events += [e for f in per_call for e in f]
    finish = reply.finish_reason or ("tool_calls" if reply.calls else "stop")
    events.append(chunk({}, finish))
    if include_usage and reply.usage is not None:
        inp, out = reply.usage
        events.append(
            sse(
                {
                    **base,
                    "choices": [],
                    "usage": {
                        "prompt_tokens": inp,
                        "completion_tokens": out,
                        "total_tokens": inp + out,
                    },
                }
            )
        )
    events.append(b"data: [DONE]\n\n")
    return events


def openai_body(reply: Reply, model: str) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.text or None, "refusal": None}
    if reply.calls:
        message["tool_calls"] = [
            {
                "id": _call_id("openai", c, i),
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments_text()},
            }
            for i, c in enumerate(reply.calls)
        ]
    body: dict[str, Any] = {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": reply.finish_reason or ("tool_calls" if reply.calls else "stop"),
            }
        ],
    }
    if reply.usage is not None:
        inp, out = reply.usage
        body["usage"] = {"prompt_tokens": inp, "completion_tokens": out, "total_tokens": inp + out}
    return body


def _anthropic_input(call: Call) -> Any:
    if isinstance(call.arguments, dict):
        return call.arguments
    try:
        return json.loads(call.arguments)
    except ValueError:
        return call.arguments  # what a broken provider would send


def anthropic_events(reply: Reply, model: str) -> list[bytes]:
    usage = {"input_tokens": reply.input_tokens, "output_tokens": 1 if reply.usage else 0}
    events = [
        sse(
            {
                "type": "message_start",
                "message": {
                    "id": "msg_fake",
                    "type": "message",
                    "role": "assistant",
                    "content": [],
                    "model": model,
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": usage,
                },
            },
            "message_start",
        ),
        sse({"type": "ping"}, "ping"),
    ]
    if reply.unknown_events:
        events.append(sse({"type": "brand_new_event", "detail": {"x": 1}}, "brand_new_event"))
    index = 0
    if reply.unknown_events:
        # A block type this client does not know, with deltas of an unknown type.
        events.append(
            sse(
                {
                    "type": "content_block_start",
                    "index": index,
                    "content_block": {"type": "mystery", "data": ""},
                },
                "content_block_start",
            )
        )
        events.append(
            sse(
                {
                    "type": "content_block_delta",
                    "index": index,
                    "delta": {"type": "mystery_delta", "data": 'hmm {"no": 1}'},
                },
                "content_block_delta",
            )
        )
        events.append(sse({"type": "content_block_stop", "index": index}, "content_block_stop"))
        index += 1
    if reply.text:
        events.append(
            sse(
                {
                    "type": "content_block_start",
                    "index": index,
                    "content_block": {"type": "text", "text": ""},
                },
                "content_block_start",
            )
        )
        for piece in _pieces(reply.text, reply.text_splits):
            events.append(
                sse(
                    {
                        "type": "content_block_delta",
                        "index": index,
                        "delta": {"type": "text_delta", "text": piece},
                    },
                    "content_block_delta",
                )
            )
            if reply.unknown_events:
                events.append(sse({"type": "ping"}, "ping"))
        events.append(sse({"type": "content_block_stop", "index": index}, "content_block_stop"))
        index += 1
    for i, call in enumerate(reply.calls):
        block = {
            "type": "tool_use",
            "id": _call_id("anthropic", call, i),
            "name": call.name,
            "input": {},
        }
        events.append(
            sse(
                {"type": "content_block_start", "index": index, "content_block": block},
                "content_block_start",
            )
        )
        for piece in _pieces(call.arguments_text(), call.splits):
            events.append(
                sse(
                    {
                        "type": "content_block_delta",
                        "index": index,
                        "delta": {"type": "input_json_delta", "partial_json": piece},
                    },
                    "content_block_delta",
                )
            )
        events.append(sse({"type": "content_block_stop", "index": index}, "content_block_stop"))
        index += 1
    stop = reply.finish_reason or ("tool_use" if reply.calls else "end_turn")
    events.append(
        sse(
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop, "stop_sequence": None},
                "usage": {"output_tokens": reply.output_tokens},
            },
            "message_delta",
        )
    )
    events.append(sse({"type": "message_stop"}, "message_stop"))
    return events


def anthropic_body(reply: Reply, model: str) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if reply.text:
        content.append({"type": "text", "text": reply.text})
    content += [
        {
            "type": "tool_use",
            "id": _call_id("anthropic", c, i),
            "name": c.name,
            "input": _anthropic_input(c),
        }
        for i, c in enumerate(reply.calls)
    ]
    return {
        "id": "msg_fake",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": reply.finish_reason or ("tool_use" if reply.calls else "end_turn"),
        "stop_sequence": None,
        "usage": {"input_tokens": reply.input_tokens, "output_tokens": reply.output_tokens},
    }


def error_body(api: str, status: int, message: str, kind: str | None) -> dict[str, Any]:
    if api == "openai":
        default = {
            429: "rate_limit_exceeded",
            400: "invalid_request_error",
            401: "invalid_api_key",
        }.get(status, "server_error")
        return {
            "error": {
                "message": message,
                "type": kind or default,
                "param": None,
                "code": kind or default,
            }
        }
    default = {
        429: "rate_limit_error",
        400: "invalid_request_error",
        401: "authentication_error",
        529: "overloaded_error",
    }.get(status, "api_error")
    return {"type": "error", "error": {"type": kind or default, "message": message}}


# Request validation (what the real APIs refuse) -----------------------------------

_ANTHROPIC_ID = re.compile(r"^[a-zA-Z0-9_-]+$")
_TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def offered_tools(api: str, body: Any) -> list[str]:
    """The names of the tools a request offers, as sent."""
    tools = body.get("tools") if isinstance(body, dict) else None
    if not isinstance(tools, list):
        return []
    if api == "openai":
        return [str(((t.get("function") or {}).get("name")) or "") for t in tools]
    return [str(t.get("name") or "") for t in tools]


def forced_tool(api: str, body: dict[str, Any]) -> tuple[str, str | None]:
    """The request's tool_choice as (kind, name): kind is auto, none, required or named."""
    choice = body.get("tool_choice")
    if api == "openai":
        if choice is None:
            return ("auto", None)
        if isinstance(choice, str):
            return (choice, None)
        return ("named", str((choice.get("function") or {}).get("name")))
    if not isinstance(choice, dict):
        return ("auto", None)
    kind = str(choice.get("type"))
    kind = {"any": "required", "tool": "named"}.get(kind, kind)
    return (str(kind), choice.get("name"))


def strict_problem(api: str, body: Any, reply: "Reply") -> str | None:
    """Why a real model given `body` could not answer `reply`, or None."""
    if not isinstance(body, dict) or reply.status >= 400 or reply.events is not None:
        return None
    offered = offered_tools(api, body)
    names = [c.name for c in reply.calls]
    unoffered = sorted({n for n in names if n not in offered})
    if unoffered:
        return (
            f"the script calls {', '.join(unoffered)}, which the request does not offer "
            f"(offered: {', '.join(offered) or 'none'})"
        )
    kind, forced = forced_tool(api, body)
    if names and kind == "none":
        return f"the script calls {', '.join(names)} but tool_choice is 'none'"
    if offered and not names and kind in ("required", "named"):
        return f"tool_choice forces a call ({forced or kind}) but the script answers with text"
    if kind == "named" and any(n != forced for n in names):
        return f"tool_choice names {forced} but the script calls {', '.join(names)}"
    parallel_off = (
        body.get("parallel_tool_calls") is False
        if api == "openai"
        else (body.get("tool_choice") or {}).get("disable_parallel_tool_use") is True
    )
    if parallel_off and len(names) > 1:
        return f"parallel tool calls are off but the script makes {len(names)} calls"
    return None


def validate_request(api: str, body: Any) -> str | None:
    """The first reason the real API would answer 400 to this body, or None."""
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
        return "messages: field required"
    if not body.get("model"):
        return "model: field required"
    return _validate_openai(body) if api == "openai" else _validate_anthropic(body)


def _validate_openai_tools(body: dict[str, Any]) -> str | None:
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list) or not tools:
            return "tools: must be a non-empty array"
        for i, tool in enumerate(tools):
            function = tool.get("function") if isinstance(tool, dict) else None
            if tool.get("type") != "function" or not isinstance(function, dict):
                return f"tools[{i}]: type 'function' and a function object are required"
            if not _TOOL_NAME.match(str(function.get("name") or "")):
                return f"tools[{i}].function.name: must match ^[a-zA-Z0-9_-]{{1,64}}$"
            parameters = function.get("parameters")
            if parameters is not None and (
                not isinstance(parameters, dict) or parameters.get("type", "object") != "object"
            ):
                return f"tools[{i}].function.parameters: must be a JSON Schema object"
        names = [t["function"]["name"] for t in tools]
        if len(set(names)) != len(names):
            return "tools: function names must be unique"
    choice = body.get("tool_choice")
    if choice is not None:
        if not tools:
            return "tool_choice: only allowed when tools are specified"
        if isinstance(choice, str):
            if choice not in ("auto", "none", "required"):
                return f"tool_choice: invalid value {choice!r}"
        elif not (
            isinstance(choice, dict)
            and choice.get("type") == "function"
            and isinstance(choice.get("function"), dict)
        ):
            return "tool_choice: a string or {type: function, function: {name}}"
        elif choice["function"].get("name") not in offered_tools("openai", body):
            return f"tool_choice: no tool named {choice['function'].get('name')!r} in tools"
    if body.get("parallel_tool_calls") is not None:
        if not tools:
            return "parallel_tool_calls: only allowed when tools are specified"
        if not isinstance(body["parallel_tool_calls"], bool):
            return "parallel_tool_calls: must be a boolean"
    return None


def _validate_anthropic_tools(body: dict[str, Any]) -> str | None:
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            return "tools: Input should be a valid list"
        for i, tool in enumerate(tools):
            if not isinstance(tool, dict) or not _TOOL_NAME.match(str(tool.get("name") or "")):
                return f"tools.{i}.name: String should match pattern '^[a-zA-Z0-9_-]{{1,64}}$'"
            schema = tool.get("input_schema")
            if not isinstance(schema, dict) or schema.get("type") != "object":
                return f"tools.{i}.input_schema.type: Input should be 'object'"
        names = [t["name"] for t in tools]
        if len(set(names)) != len(names):
            return "tools: Tool names must be unique"
    choice = body.get("tool_choice")
    if choice is not None:
        kind = choice.get("type") if isinstance(choice, dict) else None
        if kind not in ("auto", "any", "tool", "none"):
            return "tool_choice.type: Input should be 'auto', 'any', 'tool' or 'none'"
        if kind == "tool" and choice.get("name") not in offered_tools("anthropic", body):
            return f"tool_choice.name: no tool named {choice.get('name')!r} in tools"
        if kind != "none" and not tools:
            return "tool_choice: may only be specified while providing tools"
        extra = set(choice) - {"type", "name", "disable_parallel_tool_use"}
        if extra or not isinstance(choice.get("disable_parallel_tool_use", False), bool):
            return f"tool_choice: unexpected fields {sorted(extra)}"
    return None


def _validate_openai(body: dict[str, Any]) -> str | None:
    problem = _validate_openai_tools(body)
    if problem is not None:
        return problem
    pending: set[str] = set()  # tool calls of the latest assistant message not yet answered
    for i, message in enumerate(body["messages"]):
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ("system", "developer", "user", "assistant", "tool"):
            return f"messages[{i}].role: invalid value {role!r}"
        if role == "tool":
            if message.get("tool_call_id") not in pending:
                return (
                    f"messages[{i}]: messages with role 'tool' must be a response to a "
                    "preceding message with 'tool_calls'"
                )
            pending.discard(message["tool_call_id"])
            continue
        if pending:
            return (
                f"messages[{i}]: an assistant message with 'tool_calls' must be followed by "
                f"tool messages responding to each 'tool_call_id' ({', '.join(sorted(pending))})"
            )
        if role == "assistant":
            for call in message.get("tool_calls") or []:
                function = call.get("function") or {}
                if (
                    not call.get("id")
                    or not function.get("name")
                    or not isinstance(function.get("arguments"), str)
                ):
                    return (
                        f"messages[{i}].tool_calls: id, function.name and "
                        "function.arguments (a string) are required"
                    )
                pending.add(call["id"])
            if not message.get("tool_calls") and not isinstance(message.get("content"), str):
                return (
                    f"messages[{i}].content: required for an assistant message without tool_calls"
                )
    return None


def _validate_anthropic(body: dict[str, Any]) -> str | None:
    messages = body["messages"]
    if not isinstance(body.get("max_tokens"), int):
        return "max_tokens: field required"
    problem = _validate_anthropic_tools(body)
    if problem is not None:
        return problem
    if not messages or messages[0].get("role") != "user":
        return 'messages: first message must use the "user" role'
    seen: set[str] = set()
    previous_uses: set[str] = set()
    for i, message in enumerate(messages):
        role = message.get("role")
        if role not in ("user", "assistant"):
            return f"messages.{i}.role: Input should be 'user' or 'assistant'"
        if i and messages[i - 1].get("role") == role:
            return f'messages.{i}: roles must alternate between "user" and "assistant"'
        content = message.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if not isinstance(blocks, list) or not blocks:
            return f"messages.{i}.content: must be a non-empty string or list"
        uses: set[str] = set()
        for j, block in enumerate(blocks):
            kind = block.get("type")
            if kind == "text" and not block.get("text"):
                return f"messages.{i}.content.{j}: text content blocks must be non-empty"
            if kind == "tool_use":
                if role != "assistant":
                    return f"messages.{i}.content.{j}: tool_use blocks are only allowed in assistant turns"
                tool_id = str(block.get("id") or "")
                if not _ANTHROPIC_ID.match(tool_id):
                    return f"messages.{i}.content.{j}.tool_use.id: String should match pattern '^[a-zA-Z0-9_-]+$'"
                if tool_id in seen:
                    return f"messages.{i}.content.{j}: `tool_use` ids must be unique"
                seen.add(tool_id)
                uses.add(tool_id)
            if kind == "tool_result" and block.get("tool_use_id") not in previous_uses:
                return (
                    f"messages.{i}.content.{j}: unexpected `tool_use_id` found in `tool_result` blocks: "
                    f"{block.get('tool_use_id')}. Each `tool_result` block must have a corresponding `tool_use` block in the previous message."
                )
        if previous_uses:
            answered = {b.get("tool_use_id") for b in blocks if b.get("type") == "tool_result"}
            if previous_uses - answered:
                return (
                    f"messages.{i - 1}: `tool_use` ids were found without `tool_result` blocks immediately after: "
                    f"{', '.join(sorted(previous_uses - answered))}"
                )
        previous_uses = uses
    return None


# The server ------------------------------------------------------------------


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: "_HTTPServer"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass

    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        self._send_json(404, {"error": {"message": "not found"}})

    def do_POST(self) -> None:  # noqa: N802 - stdlib naming
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        fake = self.server.fake
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = None
        recorded = Recorded(
            api=fake.api,
            method="POST",
            path=self.path,
            headers={k.lower(): v for k, v in self.headers.items()},
            raw=raw,
            body=body,
            at=time.monotonic(),
        )
        if not fake.path_ok(self.path):
            fake.record(recorded)
            self._send_json(
                404, error_body(fake.api, 404, f"no route {self.path}", "not_found_error")
            )
            return
        problem = validate_request(fake.api, recorded.body) if fake.validate else None
        if problem is not None:
            # What the real API does with a malformed request; the script is not consumed.
            fake.record(recorded)
            with fake._lock:
                fake.invalid.append(problem)
            self._send_json(400, error_body(fake.api, 400, problem, "invalid_request_error"))
            return
        reply, release = fake.next_reply(recorded)
        if reply is None:
            self._send_json(
                500, error_body(fake.api, 500, "fake server: the script has no reply left", None)
            )
            return
        problem = strict_problem(fake.api, recorded.body, reply) if fake.strict else None
        if problem is not None:
            # A real model cannot do this: the test's script (or the platform's offer) is wrong.
            with fake._lock:
                fake.violations.append(f"request {len(fake._requests)}: {problem}")
            self._send_json(
                400, error_body(fake.api, 400, f"fake server (strict): {problem}", None)
            )
            return
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the client gave up
            self._answer(reply, recorded, release)

    # -- helpers --------------------------------------------------------------

    def _key(self, recorded: Recorded) -> str:
        auth = recorded.headers.get("authorization", "")
        return recorded.headers.get("x-api-key") or auth.removeprefix("Bearer ")

    def _send_json(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()
        self.close_connection = True

    def _hold(self, release: threading.Event) -> None:
        release.wait(HOLD_MAX_S)
        self.close_connection = True

    def _drop(self) -> None:
        """Close the socket abruptly, mid-answer."""
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)
        self.connection.close()

    def _write(self, data: bytes, reply: Reply) -> None:
        pieces = [data]
        if reply.write_size:
            pieces = [data[i : i + reply.write_size] for i in range(0, len(data), reply.write_size)]
        if reply.split_multibyte:
            split: list[bytes] = []
            for piece in pieces:
                at = next((i for i, b in enumerate(piece) if b >= 0xC0), None)
                if at is None:
                    split.append(piece)
                else:
                    split += [piece[: at + 1], piece[at + 1 :]]
            pieces = split
        for i, piece in enumerate(pieces):
            if not piece:
                continue
            if reply.chunked:
                piece = f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
            self.wfile.write(piece)
            self.wfile.flush()
            if i < len(pieces) - 1 and len(pieces) > 1:
                time.sleep(reply.write_pause_s)

    def _answer(self, reply: Reply, recorded: Recorded, release: threading.Event) -> None:
        fake = self.server.fake
        if reply.hang:
            self._hold(release)
            return
        if reply.drop:
            self._drop()
            return
        if reply.status >= 400:
            message = reply.error_message or f"fake provider error {reply.status}"
            if reply.echo_key:
                message += f" (the key you sent, {self._key(recorded)}, is not valid)"
            payload = (
                reply.raw_body
                if reply.raw_body is not None
                else error_body(fake.api, reply.status, message, reply.error_type)
            )
            self._send_json(reply.status, payload, reply.headers)
            return
        model = str((recorded.body or {}).get("model") or "fake-model")
        if not recorded.stream:
            self._answer_json(reply, model)
            return
        if reply.events is not None:
            events = list(reply.events)
        elif fake.api == "openai":
            include_usage = bool(
                ((recorded.body or {}).get("stream_options") or {}).get("include_usage")
            )
            events = openai_events(reply, model, include_usage)
        else:
            events = anthropic_events(reply, model)
        if reply.no_done:
            events = events[:-1]
        for at, data in sorted(reply.insert, key=lambda item: item[0], reverse=True):
            events.insert(at, data)
        if reply.bad_json_at is not None:
            events.insert(reply.bad_json_at, b'data: {"choices": [{"delta": {"content": "oops"\n\n')
        if reply.error_event_at is not None:
            problem = reply.error_event or (
                {"error": {"message": "fake mid-stream failure", "type": "server_error"}}
                if fake.api == "openai"
                else {
                    "type": "error",
                    "error": {"type": "overloaded_error", "message": "Overloaded"},
                }
            )
            if reply.echo_key:
                inner = problem.get("error", {})
                problem = {
                    **problem,
                    "error": {
                        **inner,
                        "message": f"{inner.get('message', '')} key={self._key(recorded)}",
                    },
                }
            events = [
                *events[: reply.error_event_at],
                sse(problem, None if fake.api == "openai" else "error"),
            ]

        self.send_response(reply.status)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        if reply.chunked:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Connection", "close")
        for name, value in reply.headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.flush()
        self.close_connection = True
        if reply.raw_body is not None:
            events = [reply.raw_body]
        if reply.first_delay_s:
            time.sleep(reply.first_delay_s)
        for number, data in enumerate(events):
            if reply.cut_after is not None and number >= reply.cut_after:
                self._drop()
                return
            if reply.stall_after is not None and number >= reply.stall_after:
                self._hold(release)
                return
            if number and reply.delay_s:
                time.sleep(reply.delay_s)
            self._write(data, reply)
        if reply.stall_after is not None and reply.stall_after >= len(events):
            self._hold(release)
            return
        if reply.chunked:
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

    def _answer_json(self, reply: Reply, model: str) -> None:
        fake = self.server.fake
        if reply.raw_body is not None:
            data = reply.raw_body
        else:
            body = (
                openai_body(reply, model) if fake.api == "openai" else anthropic_body(reply, model)
            )
            data = json.dumps(body, ensure_ascii=False).encode()
        self.send_response(reply.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")
        for name, value in reply.headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.close_connection = True
        if reply.first_delay_s:
            time.sleep(reply.first_delay_s)
        if reply.cut_after is not None:
            self.wfile.write(data[: reply.cut_after])
            self.wfile.flush()
            self._drop()
            return
        self._write(data, reply)


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    # Dozens of runs may connect at once (tests/billing/test_concurrency.py): the
    # default backlog of 5 resets connections a real provider would accept.
    request_queue_size = 128
    fake: "FakeModelServer"


class FakeModelServer:
    """A scripted model provider on 127.0.0.1 speaking one wire format."""

    def __init__(self, api: Api) -> None:
        self.api: Api = api
        self._lock = threading.Lock()
        self._script: deque[ReplyLike] = deque()
        self._requests: list[Recorded] = []
        self._release = threading.Event()
        self.unscripted = 0
        self.errors: list[str] = []  # script callables that raised
        # Refuse requests the real API would refuse (see validate_request), with a 400.
        self.validate = True
        self.invalid: list[str] = []
        # Scripted replies a real model could not give to their request (see strict_problem).
        self.strict = True
        self.violations: list[str] = []
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    # lifecycle
    def start(self) -> "FakeModelServer":
        httpd = _HTTPServer(("127.0.0.1", 0), _Handler)
        httpd.fake = self
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"fake-{self.api}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._release.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self) -> "FakeModelServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        assert self._httpd is not None, "server not started"
        return int(self._httpd.server_address[1])

    @property
    def base_url(self) -> str:
        """What a ModelEndpoint / SDK client's base_url should be."""
        root = f"http://127.0.0.1:{self.port}"
        return root + "/v1" if self.api == "openai" else root

    def path_ok(self, path: str) -> bool:
        path = path.split("?", 1)[0]
        return (
            path.endswith("/chat/completions")
            if self.api == "openai"
            else path.endswith("/v1/messages")
        )

    # script
    def script(self, *replies: ReplyLike) -> "FakeModelServer":
        with self._lock:
            self._script.extend(replies)
        return self

    def reset(self) -> None:
        """Forget the script and the recorded requests, and release held connections."""
        with self._lock:
            self._script.clear()
            self._requests.clear()
            self.unscripted = 0
            self.errors = []
            self.invalid = []
            self.validate = True
            self.violations = []
            self.strict = True
            self._release.set()
            self._release = threading.Event()

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._script)

    def record(self, recorded: Recorded) -> None:
        with self._lock:
            self._requests.append(recorded)

    def next_reply(self, recorded: Recorded) -> tuple[Reply | None, threading.Event]:
        with self._lock:
            self._requests.append(recorded)
            release = self._release
            if not self._script:
                self.unscripted += 1
                return None, release
            item = self._script.popleft()
        if not callable(item):
            return item, release
        try:
            return item(recorded), release
        except Exception as exc:  # noqa: BLE001 - a broken script must fail the test loudly, not hang it
            with self._lock:
                self.errors.append(
                    f"script step for request {len(self._requests)} failed: {type(exc).__name__}: {exc}"
                )
            return Reply(
                status=599, error_message=f"fake server script failed: {type(exc).__name__}: {exc}"
            ), release

    # observation
    @property
    def requests(self) -> list[Recorded]:
        with self._lock:
            return list(self._requests)

    def wait_requests(self, count: int, timeout: float = 5.0) -> list[Recorded]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.requests
            if len(found) >= count:
                return found
            time.sleep(0.01)
        raise AssertionError(f"expected {count} requests, got {len(self.requests)}")


@dataclass
class FakeServers:
    openai: FakeModelServer
    anthropic: FakeModelServer

    def reset(self) -> None:
        self.openai.reset()
        self.anthropic.reset()

    def __iter__(self) -> Iterator[FakeModelServer]:
        return iter((self.openai, self.anthropic))
