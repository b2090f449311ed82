"""OpenAI Chat Completions (and every server that speaks it: vLLM, llama.cpp,
Ollama, LiteLLM proxy), streamed over Server-Sent Events."""

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from .base import ModelProtocolError, register_adapter
from .http import HttpAdapter, post_json, post_stream, sse_events
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

FINISH_REASONS = {"stop": "stop", "tool_calls": "tool_calls", "function_call": "tool_calls", "length": "length"}


def parse_arguments(raw: str) -> tuple[dict[str, Any], str | None]:
    """Tool arguments as a dict, or ({}, what is wrong) for the model to fix."""
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
                            "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)},
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
        body: dict[str, Any] = {"model": self.endpoint.model, "messages": openai_messages(request.messages)}
        if request.tools:
            body["tools"] = [
                {"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}
                for t in request.tools
            ]
            body["tool_choice"] = (
                request.tool_choice
                if request.tool_choice in ("auto", "none", "required")
                else {"type": "function", "function": {"name": request.tool_choice}}
            )
        if request.temperature is not None:
            body["temperature"] = request.temperature
        if request.max_tokens is not None:
            body["max_tokens"] = request.max_tokens
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        return body

    async def stream(self, request: ChatRequest) -> AsyncIterator[StreamEvent]:
        """Translate chunks into events.

        Tool-call arguments arrive as fragments keyed by `index`, possibly
        interleaved across calls; `id` and `name` come only in the first
        fragment. Calls are completed when the stream finishes, in index order.
        """
        calls: dict[int, _PendingCall] = {}
        finish = "stop"
        usage: Usage | None = None
        done = False
        chunks = post_stream(self.endpoint, self.url(), self.headers(), self.payload(request, stream=True))
        async for _event, data in sse_events(chunks):
            if data.strip() == "[DONE]":
                done = True
                break
            try:
                chunk = json.loads(data)
            except ValueError:
                raise ModelProtocolError(f"'{self.endpoint.name}' sent a chunk that is not JSON") from None
            if not isinstance(chunk, dict):
                raise ModelProtocolError(f"'{self.endpoint.name}' sent a chunk of an unexpected shape")
            if isinstance(chunk.get("error"), dict):
                raise ModelProtocolError(f"'{self.endpoint.name}' reported an error mid-stream: {str(chunk['error'].get('message', ''))[:200]}")
            if isinstance(chunk.get("usage"), dict):
                usage = Usage(int(chunk["usage"].get("prompt_tokens") or 0), int(chunk["usage"].get("completion_tokens") or 0))
            for choice in chunk.get("choices") or []:
                if not isinstance(choice, dict):
                    continue
                delta = choice.get("delta") or {}
                text = delta.get("content")
                if isinstance(text, str) and text:
                    yield TextDelta(text)
                for fragment in delta.get("tool_calls") or []:
                    index = int(fragment.get("index", 0))
                    pending = calls.setdefault(index, _PendingCall())
                    function = fragment.get("function") or {}
                    pending.id = pending.id or fragment.get("id") or ""
                    pending.name = pending.name or function.get("name") or ""
                    if not pending.started and pending.name:
                        pending.started = True
                        yield ToolCallStarted(index=index, id=pending.id, name=pending.name)
                    piece = function.get("arguments")
                    if isinstance(piece, str) and piece:
                        pending.arguments.append(piece)
                        yield ToolCallArgumentsDelta(index=index, fragment=piece)
                if choice.get("finish_reason"):
                    finish = FINISH_REASONS.get(choice["finish_reason"], str(choice["finish_reason"]))
        if not done:
            raise ModelProtocolError(f"'{self.endpoint.name}' ended the stream before [DONE]")
        for event in _finish_calls(calls):
            yield event
        if usage is not None:
            yield usage
        yield Finish("tool_calls" if calls else finish)

    async def respond(self, request: ChatRequest) -> ChatResponse:
        body = await post_json(self.endpoint, self.url(), self.headers(), self.payload(request, stream=False))
        try:
            message = body["choices"][0]["message"]
        except (KeyError, IndexError, TypeError):
            raise ModelProtocolError(f"'{self.endpoint.name}' answered in an unexpected shape") from None
        response = ChatResponse(text=message.get("content") or "", finish_reason=FINISH_REASONS.get(body["choices"][0].get("finish_reason") or "stop", "stop"))
        for raw in message.get("tool_calls") or []:
            function = raw.get("function") or {}
            arguments, error = parse_arguments(function.get("arguments") or "")
            response.tool_calls.append(ToolCallRequest(id=raw.get("id") or "", name=function.get("name") or "", arguments=arguments, arguments_error=error))
        if response.tool_calls:
            response.finish_reason = "tool_calls"
        usage = body.get("usage") or {}
        if usage:
            response.usage = Usage(int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0))
        return response


def _finish_calls(calls: dict[int, _PendingCall]) -> list[StreamEvent]:
    events: list[StreamEvent] = []
    for index in sorted(calls):
        pending = calls[index]
        if not pending.name:
            raise ModelProtocolError("a tool call arrived without a name")
        arguments, error = parse_arguments("".join(pending.arguments))
        call_id = pending.id or f"call_{index}"
        events.append(ToolCallFinished(index=index, call=ToolCallRequest(id=call_id, name=pending.name, arguments=arguments, arguments_error=error)))
    return events
