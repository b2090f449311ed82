"""OpenAI Chat Completions (and every server that speaks it: vLLM, llama.cpp,
Ollama, LiteLLM proxy), streamed over Server-Sent Events."""

import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from .base import ModelProtocolError, register_adapter
from .http import HttpAdapter, json_value, post_json, post_stream, sse_batches
from .types import (
    ChatMessage,
    ChatRequest,
    ChatResponse,
    Finish,
    StreamEvent,
    TextDelta,
    ToolCallArgumentsDelta,
    ToolCallFinished,
    ToolCallRequest,
    ToolCallStarted,
    Usage,
)

FINISH_REASONS = {
    "stop": "stop",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",
    "length": "length",
}


def parse_arguments(raw: Any) -> tuple[dict[str, Any], str | None]:
    """Tool arguments as a dict, or ({}, what is wrong) for the model to fix."""
    if isinstance(raw, dict):
        return raw, None  # some OpenAI-compatible servers send an object, not a string
    if not isinstance(raw, str):
        return {}, f"expected a JSON object, got {type(raw).__name__}"
    if not raw.strip():
        return {}, None
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        return {}, f"{exc.msg} at position {exc.pos}"
    if not isinstance(value, dict):
        return {}, f"expected a JSON object, got {type(value).__name__}"
    return value, None


def openai_messages(messages: tuple[ChatMessage, ...]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for m in messages:
        if m.role == "tool":
            out.append({"role": "tool", "tool_call_id": m.tool_call_id, "content": m.content})
        elif m.role == "assistant" and m.tool_calls:
            out.append(
                {
                    "role": "assistant",
                    "content": m.content or None,
                    "tool_calls": [
                        {
                            "id": c.id,
                            "type": "function",
                            "function": {
                                "name": c.name,
                                "arguments": json.dumps(c.arguments, ensure_ascii=False),
                            },
                        }
                        for c in m.tool_calls
                    ],
                }
            )
        else:
            out.append({"role": m.role, "content": m.content})
    return out


@dataclass
class _PendingCall:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)
    started: bool = False


@register_adapter
class OpenAIAdapter(HttpAdapter):
    api = "openai"

    def url(self) -> str:
        return self.endpoint.base_url.rstrip("/") + "/chat/completions"

    def headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        key = self.api_key()
        if key:
            headers["Authorization"] = f"Bearer {key}"
        return headers

    def payload(self, request: ChatRequest, *, stream: bool) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.endpoint.model,
            "messages": openai_messages(request.messages),
        }
        if request.tools:
            body["tools"] = [
                {
                    "type": "function",
                    "function": {
                        "name": t.name,
                        "description": t.description,
                        "parameters": t.parameters,
                    },
                }
                for t in request.tools
            ]
            body["tool_choice"] = (
                request.tool_choice
                if request.tool_choice in ("auto", "none", "required")
                else {"type": "function", "function": {"name": request.tool_choice}}
            )
            if request.parallel_tool_calls is not None:
                body["parallel_tool_calls"] = request.parallel_tool_calls
        if request.temperature is not None:
            body["temperature"] = request.temperature
        if request.top_p is not None:
            body["top_p"] = request.top_p
        if request.max_tokens is not None:
            body["max_tokens"] = request.max_tokens
        if request.stop:
            body["stop"] = list(request.stop)
        if request.seed is not None:
            body["seed"] = request.seed
        answer = request.response_format
        if answer is not None and answer.schema is None:
            body["response_format"] = {"type": "json_object"}
        elif answer is not None:
            schema: dict[str, Any] = {"name": answer.name, "schema": answer.schema}
            if answer.strict:
                schema["strict"] = True
            body["response_format"] = {"type": "json_schema", "json_schema": schema}
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        return body

    async def stream(self, request: ChatRequest) -> AsyncIterator[StreamEvent]:
        """Translate chunks into events.

        Tool-call arguments arrive as fragments keyed by `index`, possibly
        interleaved across calls; `id` and `name` come only in the first
        fragment. Calls are completed when the stream finishes, in the order
        they started. A fragment without `index`, or with a new `id` on an index
        already in use, starts a new call (servers that do this exist).
        A chunk of an unexpected shape ends the call as a protocol error.
        """
        calls: dict[int, _PendingCall] = {}
        state = _StreamState()
        done = False
        chunks = post_stream(
            self.endpoint, self.url(), self.headers(), self.payload(request, stream=True)
        )
        async for batch in sse_batches(chunks):
            for _event, data in batch:
                if data[-1:] != "}" and data.strip() == "[DONE]":
                    done = True
                    break
                try:
                    chunk = json_value(data)
                except ValueError:
                    raise ModelProtocolError(
                        f"'{self.endpoint.name}' sent a chunk that is not JSON"
                    ) from None
                text = _plain_text(chunk)
                if text is not None:
                    yield TextDelta(text)
                    continue
                if isinstance(chunk, dict) and isinstance(chunk.get("error"), dict):
                    message = self.scrub(str(chunk["error"].get("message", "")))[:200]
                    raise ModelProtocolError(
                        f"'{self.endpoint.name}' reported an error mid-stream: {message}"
                    )
                try:
                    events = _read_chunk(chunk, calls, state)
                except (TypeError, ValueError, AttributeError, KeyError):
                    raise ModelProtocolError(
                        f"'{self.endpoint.name}' sent a chunk of an unexpected shape"
                    ) from None
                for event in events:
                    yield event
            if done:
                break
        if not done:
            raise ModelProtocolError(f"'{self.endpoint.name}' ended the stream before [DONE]")
        for event in _finish_calls(calls):
            yield event
        if state.usage is not None:
            yield state.usage
        yield Finish("tool_calls" if calls else state.finish)

    async def respond(self, request: ChatRequest) -> ChatResponse:
        names = self.wire_names(request)
        if names is not None:
            request = names.outgoing(request)
        body = await post_json(
            self.endpoint, self.url(), self.headers(), self.payload(request, stream=False)
        )
        try:
            response = _read_completion(body)
            return names.response(response) if names is not None else response
        except (TypeError, ValueError, AttributeError, KeyError, IndexError):
            raise ModelProtocolError(
                f"'{self.endpoint.name}' answered in an unexpected shape"
            ) from None


@dataclass
class _StreamState:
    finish: str = "stop"
    usage: Usage | None = None
    # Wire `index` -> our slot, and call id -> slot: some OpenAI-compatible servers
    # omit `index` (Gemini) or give every call index 0 (Ollama); a new id is a new call.
    slots: dict[int, int] = field(default_factory=dict)
    ids: dict[str, int] = field(default_factory=dict)
    last: int | None = None

    def slot(self, calls: dict[int, "_PendingCall"], wire: Any, call_id: str) -> int:
        if wire is not None and (not isinstance(wire, int) or isinstance(wire, bool)):
            raise TypeError("tool call index is not an integer")
        if call_id and call_id in self.ids:
            slot = self.ids[call_id]
        elif wire is None:
            slot = len(calls) if (call_id or self.last is None) else self.last
        else:
            known = self.slots.get(wire)
            if known is None or (call_id and calls[known].id and calls[known].id != call_id):
                slot = len(calls)
            else:
                slot = known
            self.slots[wire] = slot
        if call_id:
            self.ids.setdefault(call_id, slot)
        self.last = slot
        return slot


def _usage(raw: dict[str, Any]) -> Usage:
    return Usage(int(raw.get("prompt_tokens") or 0), int(raw.get("completion_tokens") or 0))


def _plain_text(chunk: Any) -> str | None:
    """The text of a chunk that carries nothing but a text delta (nearly every chunk of
    an answer), or None for anything else, which `_read_chunk` then takes apart."""
    if type(chunk) is not dict or chunk.get("usage") is not None or "error" in chunk:
        return None
    choices = chunk.get("choices")
    if type(choices) is not list or len(choices) != 1:
        return None
    choice = choices[0]
    if type(choice) is not dict or choice.get("finish_reason"):
        return None
    delta = choice.get("delta")
    if type(delta) is not dict or delta.get("tool_calls"):
        return None
    text = delta.get("content")
    return text if type(text) is str and text else None


def _read_chunk(
    chunk: Any, calls: dict[int, _PendingCall], state: _StreamState
) -> list[StreamEvent]:
    """The events in one chunk; raises TypeError/ValueError/... on a shape we cannot use."""
    if not isinstance(chunk, dict):
        raise TypeError("chunk is not an object")
    events: list[StreamEvent] = []
    if isinstance(chunk.get("usage"), dict):
        state.usage = _usage(chunk["usage"])
    choices = chunk.get("choices") or []
    if not isinstance(choices, list):
        raise TypeError("choices is not a list")
    for choice in choices:
        if not isinstance(choice, dict):
            raise TypeError("choice is not an object")
        delta = choice.get("delta") or {}
        if not isinstance(delta, dict):
            raise TypeError("delta is not an object")
        text = delta.get("content")
        if isinstance(text, str) and text:
            events.append(TextDelta(text))
        fragments = delta.get("tool_calls") or []
        if not isinstance(fragments, list):
            raise TypeError("tool_calls is not a list")
        for fragment in fragments:
            if not isinstance(fragment, dict):
                raise TypeError("tool call fragment is not an object")
            call_id = str(fragment.get("id") or "")
            index = state.slot(calls, fragment.get("index"), call_id)
            pending = calls.setdefault(index, _PendingCall())
            function = fragment.get("function") or {}
            if not isinstance(function, dict):
                raise TypeError("function is not an object")
            pending.id = pending.id or call_id
            pending.name = pending.name or str(function.get("name") or "")
            if not pending.started and pending.name:
                pending.started = True
                events.append(ToolCallStarted(index=index, id=pending.id, name=pending.name))
            piece = function.get("arguments")
            if isinstance(piece, str) and piece:
                pending.arguments.append(piece)
                events.append(ToolCallArgumentsDelta(index=index, fragment=piece))
        if choice.get("finish_reason"):
            state.finish = FINISH_REASONS.get(choice["finish_reason"], str(choice["finish_reason"]))
    return events


def _read_completion(body: Any) -> ChatResponse:
    """A non-streamed completion; raises TypeError/KeyError/... on a shape we cannot use."""
    choice = body["choices"][0]
    message = choice["message"]
    if not isinstance(message, dict):
        raise TypeError("message is not an object")
    content = message.get("content") or ""
    if not isinstance(content, str):
        raise TypeError("content is not text")
    response = ChatResponse(
        text=content,
        finish_reason=FINISH_REASONS.get(choice.get("finish_reason") or "stop", "stop"),
    )
    for raw in message.get("tool_calls") or []:
        function = raw.get("function") or {}
        arguments, error = parse_arguments(function.get("arguments") or "")
        response.tool_calls.append(
            ToolCallRequest(
                id=str(raw.get("id") or ""),
                name=str(function.get("name") or ""),
                arguments=arguments,
                arguments_error=error,
            )
        )
    if response.tool_calls:
        response.finish_reason = "tool_calls"
    usage = body.get("usage") or {}
    if usage:
        response.usage = _usage(usage)
    return response


def _finish_calls(calls: dict[int, _PendingCall]) -> list[StreamEvent]:
    events: list[StreamEvent] = []
    for index in sorted(calls):
        pending = calls[index]
        if not pending.name:
            raise ModelProtocolError("a tool call arrived without a name")
        arguments, error = parse_arguments("".join(pending.arguments))
        call_id = pending.id or f"call_{uuid.uuid4().hex[:16]}"  # unique across steps
        events.append(
            ToolCallFinished(
                index=index,
                call=ToolCallRequest(
                    id=call_id, name=pending.name, arguments=arguments, arguments_error=error
                ),
            )
        )
    return events
