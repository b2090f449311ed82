"""Anthropic Messages API over Server-Sent Events."""

import re
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from .base import ModelProtocolError, ModelUnavailable, register_adapter
from .http import HttpAdapter, json_value, post_json, post_stream, sse_batches
from .openai import parse_arguments
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

API_VERSION = "2023-06-01"
DEFAULT_MAX_TOKENS = 4096
STOP_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "tool_use": "tool_calls",
    "max_tokens": "length",
}


_ID_UNSAFE = re.compile(r"[^a-zA-Z0-9_-]")


def anthropic_messages(messages: tuple[ChatMessage, ...]) -> tuple[str, list[dict[str, Any]]]:
    """System text goes to the top-level field; tool results become `tool_result`
    blocks in a user turn; consecutive turns of one role are merged, as the API requires.

    The API also wants every `tool_use` id unique in the request and made of
    `[a-zA-Z0-9_-]`. A history written by other models (the offline rules model,
    prompt-mode tools, an OpenAI-compatible server) may repeat ids across steps or
    use other characters, so ids are rewritten here, and each tool result points
    at the rewritten id of the call it answers (the latest one with its id).
    """
    system: list[str] = []
    out: list[dict[str, Any]] = []
    used: set[str] = set()
    current: dict[str, str] = {}  # original id -> wire id, for the latest assistant turn

    def wire_id(original: str) -> str:
        base = _ID_UNSAFE.sub("_", original)[:60] or "toolu"
        candidate, n = base, 1
        while candidate in used:
            n += 1
            candidate = f"{base}_{n}"
        used.add(candidate)
        return candidate

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": list(blocks)})

    for m in messages:
        if m.role == "system":
            system.append(m.content)
        elif m.role == "tool":
            block: dict[str, Any] = {
                "type": "tool_result",
                "tool_use_id": current.get(m.tool_call_id) or _ID_UNSAFE.sub("_", m.tool_call_id),
                "content": m.content,
            }
            if isinstance(m.data, dict) and m.data.get("status") in (
                "failed",
                "timeout",
                "rejected",
            ):
                block["is_error"] = True
            add("user", [block])
        elif m.role == "assistant":
            blocks: list[dict[str, Any]] = (
                [{"type": "text", "text": m.content}] if m.content else []
            )
            if m.tool_calls:
                current = {}
            for c in m.tool_calls:
                current[c.id] = wire_id(c.id)
                blocks.append(
                    {"type": "tool_use", "id": current[c.id], "name": c.name, "input": c.arguments}
                )
            if blocks:  # the API refuses empty text blocks; an empty turn says nothing anyway
                add("assistant", blocks)
        else:
            add("user", [{"type": "text", "text": m.content}])
    return "\n\n".join(s for s in system if s), out


@register_adapter
class AnthropicAdapter(HttpAdapter):
    api = "anthropic"

    def url(self) -> str:
        return self.endpoint.base_url.rstrip("/") + "/v1/messages"

    def headers(self) -> dict[str, str]:
        headers = {
            "Content-Type": "application/json",
            "anthropic-version": API_VERSION,
            "Accept": "text/event-stream",
        }
        key = self.api_key()
        if key:
            headers["x-api-key"] = key
        return headers

    def payload(self, request: ChatRequest, *, stream: bool) -> dict[str, Any]:
        system, messages = anthropic_messages(request.messages)
        body: dict[str, Any] = {
            "model": self.endpoint.model,
            "messages": messages,
            "max_tokens": request.max_tokens
            or int(self.endpoint.options.get("max_tokens", DEFAULT_MAX_TOKENS)),
        }
        if system:
            body["system"] = system
        if request.tools:
            body["tools"] = [
                {"name": t.name, "description": t.description, "input_schema": t.parameters}
                for t in request.tools
            ]
            choice = request.tool_choice
            tool_choice: dict[str, Any] = (
                {"type": choice}
                if choice in ("auto", "none")
                else {"type": "any"}
                if choice == "required"
                else {"type": "tool", "name": choice}
            )
            if request.parallel_tool_calls is False and choice != "none":
                tool_choice["disable_parallel_tool_use"] = True
            body["tool_choice"] = tool_choice
        if request.temperature is not None:
            body["temperature"] = request.temperature
        if request.top_p is not None:
            body["top_p"] = request.top_p
        if request.stop:
            body["stop_sequences"] = list(request.stop)
        # No seed and no structured output on this wire: the engine asks for JSON in the
        # prompt and validates the answer (engine/model/structured.py).
        if stream:
            body["stream"] = True
        return body

    async def stream(self, request: ChatRequest) -> AsyncIterator[StreamEvent]:
        """Translate Messages events into ours. `ping` and unknown event, block and
        delta types are ignored; an `error` event or a shape we cannot use ends the call."""
        state = _StreamState()
        chunks = post_stream(
            self.endpoint, self.url(), self.headers(), self.payload(request, stream=True)
        )
        async for batch in sse_batches(chunks):
            for event, data in batch:
                try:
                    body = json_value(data)
                except ValueError:
                    raise ModelProtocolError(
                        f"'{self.endpoint.name}' sent an event that is not JSON"
                    ) from None
                text = _plain_text(body)
                if text is not None:
                    yield TextDelta(text)
                    continue
                if not isinstance(body, dict):
                    raise ModelProtocolError(
                        f"'{self.endpoint.name}' sent an event of an unexpected shape"
                    )
                kind = body.get("type") or event
                if kind == "error":
                    raw_problem = body.get("error")
                    problem: dict[str, Any] = raw_problem if isinstance(raw_problem, dict) else {}
                    message = self.scrub(str(problem.get("message", "")))[:200]
                    if problem.get("type") in ("overloaded_error", "api_error"):
                        raise ModelUnavailable(
                            f"'{self.endpoint.name}' failed mid-stream: {message}"
                        )
                    raise ModelProtocolError(
                        f"'{self.endpoint.name}' reported an error mid-stream: {message}"
                    )
                try:
                    events = _read_event(kind, body, state)
                except (TypeError, ValueError, AttributeError, KeyError):
                    raise ModelProtocolError(
                        f"'{self.endpoint.name}' sent an event of an unexpected shape"
                    ) from None
                for item in events:
                    yield item
                if state.stopped:
                    break
            if state.stopped:
                break
        if not state.stopped:
            raise ModelProtocolError(f"'{self.endpoint.name}' ended the stream before message_stop")
        for index in sorted(state.blocks):
            if not state.blocks[index].get("done"):
                raise ModelProtocolError(f"'{self.endpoint.name}' never closed a tool_use block")
        yield Usage(state.input_tokens, state.output_tokens)
        yield Finish("tool_calls" if state.blocks else state.finish)

    async def respond(self, request: ChatRequest) -> ChatResponse:
        names = self.wire_names(request)
        if names is not None:
            request = names.outgoing(request)
        body = await post_json(
            self.endpoint, self.url(), self.headers(), self.payload(request, stream=False)
        )
        try:
            response = _read_message(body)
            return names.response(response) if names is not None else response
        except (TypeError, ValueError, AttributeError, KeyError):
            raise ModelProtocolError(
                f"'{self.endpoint.name}' answered in an unexpected shape"
            ) from None


def _read_message(body: Any) -> ChatResponse:
    """A non-streamed Messages answer; raises TypeError/... on a shape we cannot use."""
    if not isinstance(body, dict) or not isinstance(body.get("content"), list):
        raise TypeError("no content list")
    response = ChatResponse(
        finish_reason=STOP_REASONS.get(body.get("stop_reason") or "end_turn", "stop")
    )
    texts: list[str] = []
    for block in body["content"]:
        if not isinstance(block, dict):
            continue
        if block.get("type") == "text":
            texts.append(str(block.get("text") or ""))
        elif block.get("type") == "tool_use":
            raw = block.get("input")
            arguments, error = (
                (raw, None) if isinstance(raw, dict) else ({}, "tool input is not a JSON object")
            )
            response.tool_calls.append(
                ToolCallRequest(
                    id=str(block.get("id") or ""),
                    name=str(block.get("name") or ""),
                    arguments=arguments,
                    arguments_error=error,
                )
            )
    response.text = "".join(texts)
    usage = _object(body.get("usage"))
    response.usage = Usage(
        int(usage.get("input_tokens") or 0), int(usage.get("output_tokens") or 0)
    )
    if response.tool_calls:
        response.finish_reason = "tool_calls"
    return response


@dataclass
class _StreamState:
    blocks: dict[int, dict[str, Any]] = field(default_factory=dict)
    input_tokens: int = 0
    output_tokens: int = 0
    finish: str = "stop"
    stopped: bool = False


def _index(body: dict[str, Any]) -> int:
    index = body.get("index", 0)
    if not isinstance(index, int) or isinstance(index, bool):
        raise TypeError("index is not an integer")
    return index


def _object(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise TypeError("expected an object")
    return value


def _plain_text(body: Any) -> str | None:
    """The text of a `content_block_delta` that carries a plain text delta (nearly every
    event of an answer), or None for anything else, which `_read_event` then takes apart."""
    if type(body) is not dict or body.get("type") != "content_block_delta":
        return None
    if type(body.get("index", 0)) is not int:
        return None
    delta = body.get("delta")
    if type(delta) is not dict or delta.get("type") != "text_delta":
        return None
    text = delta.get("text")
    return text if type(text) is str and text else None


def _read_event(kind: Any, body: dict[str, Any], state: _StreamState) -> list[StreamEvent]:
    """The events one SSE event yields; raises TypeError/ValueError/... on a shape we cannot use."""
    events: list[StreamEvent] = []
    if kind == "message_start":
        usage = _object(_object(body.get("message")).get("usage"))
        state.input_tokens = int(usage.get("input_tokens") or 0)
        state.output_tokens = int(usage.get("output_tokens") or 0)
    elif kind == "content_block_start":
        index = _index(body)
        block = _object(body.get("content_block"))
        if block.get("type") == "tool_use":
            call_id = str(block.get("id") or f"toolu_{uuid.uuid4().hex[:16]}")
            state.blocks[index] = {"id": call_id, "name": str(block.get("name") or ""), "json": []}
            events.append(
                ToolCallStarted(index=index, id=call_id, name=state.blocks[index]["name"])
            )
        elif block.get("type") == "text" and block.get("text"):
            events.append(TextDelta(str(block["text"])))
    elif kind == "content_block_delta":
        index = _index(body)
        delta = _object(body.get("delta"))
        if delta.get("type") == "text_delta" and delta.get("text"):
            events.append(TextDelta(str(delta["text"])))
        elif delta.get("type") == "input_json_delta" and index in state.blocks:
            piece = delta.get("partial_json") or ""
            if not isinstance(piece, str):
                raise TypeError("partial_json is not text")
            if piece:
                state.blocks[index]["json"].append(piece)
                events.append(ToolCallArgumentsDelta(index=index, fragment=piece))
    elif kind == "content_block_stop":
        index = _index(body)
        open_block = state.blocks.get(index)
        if open_block is not None and not open_block.get("done"):
            open_block["done"] = True
            arguments, error = parse_arguments("".join(open_block["json"]))
            events.append(
                ToolCallFinished(
                    index=index,
                    call=ToolCallRequest(
                        id=open_block["id"],
                        name=open_block["name"],
                        arguments=arguments,
                        arguments_error=error,
                    ),
                )
            )
    elif kind == "message_delta":
        delta = _object(body.get("delta"))
        if delta.get("stop_reason"):
            state.finish = STOP_REASONS.get(delta["stop_reason"], str(delta["stop_reason"]))
        usage = _object(body.get("usage"))
        if usage.get("output_tokens") is not None:
            state.output_tokens = int(usage["output_tokens"])
        if usage.get("input_tokens"):
            state.input_tokens = int(usage["input_tokens"])
    elif kind == "message_stop":
        state.stopped = True
    # ping and unknown event types are ignored on purpose.
    return events
