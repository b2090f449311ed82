"""Tool calling for models that only produce text (an OpenAI-compatible endpoint
without tool support): the tools are described in the system prompt, and the
reply is parsed as JSON, strictly first and then tolerantly."""

import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import json_repair

from .base import register_adapter
from .openai import OpenAIAdapter
from .types import (
    ChatMessage,
    ChatRequest,
    Finish,
    StreamEvent,
    TextDelta,
    ToolCallArgumentsDelta,
    ToolCallFinished,
    ToolCallRequest,
    ToolCallStarted,
    ToolSpec,
    Usage,
)

MAX_CORRECTIONS = 2
GAVE_UP_ANSWER = "I'm sorry, I could not produce a valid answer this time. Please rephrase your request or try again."

FORMAT = """You can use tools. To call tools, reply with ONLY one JSON object and nothing else:
{{"tool_calls": [{{"name": "<tool name>", "arguments": {{...}}}}]}}
To answer the user, reply with ONLY: {{"answer": "<your answer>"}}
Use double quotes, no comments, no trailing commas, no code fences.

Available tools (name, description, JSON Schema of the arguments):
{tools}"""


class ReplyError(ValueError):
    pass


def tools_prompt(tools: tuple[ToolSpec, ...]) -> str:
    lines = [
        f"- {t.name}: {t.description}\n  arguments schema: {json.dumps(t.parameters, ensure_ascii=False, separators=(',', ':'))}"
        for t in tools
    ]
    return FORMAT.format(tools="\n".join(lines))


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        pass
    # Tolerant pass: code fences, trailing commas, single quotes, comments,
    # missing closing braces and prose around the object.
    start = text.find("{")
    if start < 0:
        raise ReplyError("the reply contains no JSON object")
    repaired = json_repair.loads(text[start:])
    if not isinstance(repaired, dict) or not repaired:
        raise ReplyError("the reply is not a JSON object")
    return repaired


def parse_reply(text: str, known: set[str]) -> tuple[str, list[tuple[str, dict[str, Any]]]]:
    """Return (answer, calls) or raise ReplyError saying what to fix."""
    stripped = text.strip()
    if not stripped:
        raise ReplyError("the reply was empty")
    if "{" not in stripped:
        return stripped, []  # plain prose: take it as the answer
    value = _loads(stripped)
    if not isinstance(value, dict):
        raise ReplyError("the reply must be one JSON object")
    if isinstance(value.get("answer"), str) and "tool_calls" not in value:
        return value["answer"], []
    raw_calls = value.get("tool_calls")
    if raw_calls is None and isinstance(value.get("name"), str):
        raw_calls = [value]  # a single call without the wrapper
    if not isinstance(raw_calls, list) or not raw_calls:
        raise ReplyError('expected {"tool_calls": [...]} or {"answer": "..."}')
    calls: list[tuple[str, dict[str, Any]]] = []
    for i, raw in enumerate(raw_calls):
        if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
            raise ReplyError(f'tool_calls[{i}] must be an object with a string "name"')
        if raw["name"] not in known:
            raise ReplyError(
                f"tool_calls[{i}] names no known tool '{raw['name']}' (known: {', '.join(sorted(known)) or 'none'})"
            )
        arguments = raw.get("arguments", {})
        if isinstance(arguments, str):
            arguments = _loads(arguments) if arguments.strip() else {}
        if not isinstance(arguments, dict):
            raise ReplyError(f"tool_calls[{i}].arguments must be a JSON object")
        calls.append((raw["name"], arguments))
    return "", calls


@register_adapter
class PromptToolsAdapter(OpenAIAdapter):
    api = "prompt_tools"

    def _request(self, request: ChatRequest, extra: list[ChatMessage]) -> ChatRequest:
        messages = list(request.messages)
        if request.tools:
            instructions = ChatMessage(role="system", content=tools_prompt(request.tools))
            insert_at = 1 if messages and messages[0].role == "system" else 0
            messages.insert(insert_at, instructions)
        # The wire has no tool roles: replay past calls and results as text.
        flat: list[ChatMessage] = []
        for m in messages + extra:
            if m.role == "assistant" and m.tool_calls:
                payload = {
                    "tool_calls": [{"name": c.name, "arguments": c.arguments} for c in m.tool_calls]
                }
                flat.append(
                    ChatMessage(role="assistant", content=json.dumps(payload, ensure_ascii=False))
                )
            elif m.role == "tool":
                flat.append(
                    ChatMessage(
                        role="user", content=f"Result of {m.name} ({m.tool_call_id}):\n{m.content}"
                    )
                )
            else:
                flat.append(ChatMessage(role=m.role, content=m.content))
        return replace(request, messages=tuple(flat), tools=(), tool_choice="none")

    async def stream(self, request: ChatRequest) -> AsyncIterator[StreamEvent]:
        """Ask, parse, and on a bad reply show the model its reply and the error (at most twice)."""
        if not request.tools:
            # Nothing to call (the final step of a turn, or an agent without tools): the
            # model was told nothing about JSON, so its reply is the answer, streamed as is.
            async for event in super().stream(self._request(request, [])):
                yield event
            return
        known = {t.name for t in request.tools}
        extra: list[ChatMessage] = []
        input_tokens = output_tokens = 0
        for attempt in range(MAX_CORRECTIONS + 1):
            text_parts: list[str] = []
            async for event in super().stream(self._request(request, extra)):
                if isinstance(event, TextDelta):
                    text_parts.append(event.text)  # held back: it may be JSON
                elif isinstance(event, Usage):
                    input_tokens += event.input_tokens
                    output_tokens += event.output_tokens
            reply = "".join(text_parts)
            try:
                answer, calls = parse_reply(reply, known)
            except (ReplyError, ValueError) as exc:
                if attempt == MAX_CORRECTIONS:
                    answer, calls = GAVE_UP_ANSWER, []
                else:
                    extra += [
                        ChatMessage(role="assistant", content=reply),
                        ChatMessage(
                            role="user",
                            content=f"Your reply could not be used: {exc}. Reply again with only the JSON object described in the instructions.",
                        ),
                    ]
                    continue
            if calls:
                for index, (name, arguments) in enumerate(calls):
                    call_id = f"call_{uuid.uuid4().hex[:16]}"  # unique across steps
                    yield ToolCallStarted(index=index, id=call_id, name=name)
                    yield ToolCallArgumentsDelta(
                        index=index, fragment=json.dumps(arguments, ensure_ascii=False)
                    )
                    yield ToolCallFinished(
                        index=index,
                        call=ToolCallRequest(id=call_id, name=name, arguments=arguments),
                    )
            else:
                yield TextDelta(answer)
            yield Usage(input_tokens, output_tokens)
            yield Finish("tool_calls" if calls else "stop")
            return

    async def respond(self, request: ChatRequest) -> Any:
        return await self.complete(request)
