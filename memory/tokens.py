"""An offline token estimate, good enough for budgets and usage when a provider reports none.

Latin text runs about four characters a token in common BPE vocabularies; CJK and
other non-ASCII characters are closer to one token each. We round up so a
budget built on the estimate errs on the safe side.
"""

import json
import math
import threading
from collections.abc import Mapping, Sequence
from typing import Any, Protocol


def count_tokens(text: str) -> int:
    if not text:
        return 0
    if text.isascii():
        return math.ceil(len(text) / 4)
    # Counting in C: encoding to ASCII with errors ignored keeps exactly the ASCII characters.
    ascii_chars = len(text.encode("ascii", "ignore"))
    return math.ceil(ascii_chars / 4) + (len(text) - ascii_chars)


MESSAGE_OVERHEAD_TOKENS = 4  # role and separators, as chat formats add


def count_message_tokens(content: str, extra: str = "") -> int:
    return MESSAGE_OVERHEAD_TOKENS + count_tokens(content) + count_tokens(extra)


# The shapes of llm.types (ChatRequest, ChatResponse) that the estimates read. They are
# described here, not imported: the model adapters use this module, so it imports nothing.


class _ToolCall(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def arguments(self) -> Mapping[str, Any]: ...


class _Message(Protocol):
    @property
    def content(self) -> str: ...
    @property
    def tool_calls(self) -> Sequence[_ToolCall]: ...


class _Tool(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def description(self) -> str: ...
    @property
    def parameters(self) -> Mapping[str, Any]: ...


class _Request(Protocol):
    @property
    def messages(self) -> Sequence[_Message]: ...
    @property
    def tools(self) -> Sequence[_Tool]: ...


class _Response(Protocol):
    @property
    def text(self) -> str: ...
    @property
    def tool_calls(self) -> Sequence[_ToolCall]: ...


def _call_tokens(call: _ToolCall) -> int:
    return count_tokens(call.name) + count_tokens(json.dumps(call.arguments, ensure_ascii=False))


# The last request this thread estimated, and its count (see estimate_request_tokens).
_last = threading.local()


def estimate_request_tokens(request: _Request) -> int:
    """What a chat request will cost in input tokens: messages, tool calls and tool schemas.

    A model step asks this of the same request up to three times (the budget gate,
    the credits check, the call's context-window check), and the gate may hand on
    a copy with another `max_tokens`: the thread's last answer is kept for the
    messages and tools it counted (held, so their identity is not reused).
    """
    messages, tools = request.messages, request.tools
    last = getattr(_last, "counted", None)
    if last is not None and last[0] is messages and last[1] is tools:
        return int(last[2])
    total = _request_tokens(request)
    _last.counted = (messages, tools, total)
    return total


def _request_tokens(request: _Request) -> int:
    total = 0
    for m in request.messages:
        total += MESSAGE_OVERHEAD_TOKENS + count_tokens(m.content)
        for c in m.tool_calls:
            total += _call_tokens(c)
    for t in request.tools:
        total += (
            count_tokens(t.name)
            + count_tokens(t.description)
            + count_tokens(json.dumps(t.parameters))
        )
    return total


def estimate_response_tokens(response: _Response) -> int:
    """What an answer cost in output tokens, for a provider that reports no usage."""
    return count_tokens(response.text) + sum(_call_tokens(c) for c in response.tool_calls)
