"""Tool names every wire format accepts, and the way back.

OpenAI takes function names matching ^[a-zA-Z0-9_-]{1,64}$, Anthropic a
similar set; our MCP tools are named `<server>.<tool>`. A name that fits goes
out unchanged; another goes out as e.g. `parcels__track_parcel`, and the
model's calls come back under the stored name. The map is built per request
from the names it carries, so nothing is stored and every adapter agrees.
"""

import hashlib
import re
from collections.abc import Iterable
from dataclasses import replace

from .types import (
    ChatMessage,
    ChatRequest,
    ChatResponse,
    StreamEvent,
    ToolCallFinished,
    ToolCallStarted,
)

WIRE_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_CHARS = 64


def wire_name(name: str) -> str:
    """`parcels.track_parcel` -> `parcels__track_parcel`; a name that fits is returned as it is."""
    if WIRE_NAME.match(name):
        return name
    out = re.sub(r"[^A-Za-z0-9_-]", "_", name.replace(".", "__"))
    return out if 0 < len(out) <= MAX_CHARS else _hashed(out, name)


def _hashed(out: str, name: str) -> str:
    return out[: MAX_CHARS - 9] + "_" + hashlib.sha256(name.encode()).hexdigest()[:8]


class WireNames:
    """One request's map between stored tool names and the names sent."""

    def __init__(self, names: Iterable[str]) -> None:
        unique = sorted(set(names))
        taken = {n for n in unique if WIRE_NAME.match(n)}
        self.out: dict[str, str] = {}
        self.back: dict[str, str] = {}
        for name in unique:
            if name in taken:
                continue
            sent = wire_name(name)
            if sent in taken:
                # A tool already called `parcels__track_parcel`: this one gets a hashed name.
                sent = _hashed(sent, name)
            taken.add(sent)
            self.out[name] = sent
            self.back[sent] = name

    @classmethod
    def for_request(cls, request: ChatRequest) -> "WireNames | None":
        names = [t.name for t in request.tools]
        for message in request.messages:
            names.extend(call.name for call in message.tool_calls)
            if message.role == "tool" and message.name:
                names.append(message.name)
        found = cls(names)
        return found if found.out else None

    def outgoing(self, request: ChatRequest) -> ChatRequest:
        out = self.out
        tools = tuple(replace(t, name=out.get(t.name, t.name)) for t in request.tools)
        messages = tuple(self._message(m) for m in request.messages)
        choice = request.tool_choice
        if choice not in ("auto", "none", "required"):
            choice = out.get(choice, choice)
        return replace(request, tools=tools, messages=messages, tool_choice=choice)

    def _message(self, message: ChatMessage) -> ChatMessage:
        out = self.out
        if message.tool_calls:
            calls = tuple(replace(c, name=out.get(c.name, c.name)) for c in message.tool_calls)
            message = replace(message, tool_calls=calls)
        if message.name in out:
            message = replace(message, name=out[message.name])
        return message

    def incoming(self, event: StreamEvent) -> StreamEvent:
        if isinstance(event, ToolCallStarted) and event.name in self.back:
            return replace(event, name=self.back[event.name])
        if isinstance(event, ToolCallFinished) and event.call.name in self.back:
            return replace(event, call=replace(event.call, name=self.back[event.call.name]))
        return event

    def response(self, response: ChatResponse) -> ChatResponse:
        response.tool_calls = [
            replace(c, name=self.back.get(c.name, c.name)) for c in response.tool_calls
        ]
        return response
