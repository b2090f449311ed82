"""The token budget of one model request: the window split into partitions.

The seed's split for a 128K window is 8K for the system prompt and tools, 64K
for the history, 16K for long-term memory; the current input plus the reply
get 36K and a safety buffer 4K. Counts are the endpoint's tokenizer's
(memory/tokens.py), so the buffer covers only what the wire adds that no count
sees: the reply's priming, the provider's rendering of the tool schemas (an
Anthropic tool-use prompt is a few hundred tokens), a message's `name`.
(Before real tokenizers it was 24K of 128K for estimated counts; the 20K it
gave up went to the reply, so every history limit stayed the same.) Smaller or
larger windows scale the same shares. An agent overrides any partition in
`Agent.context_budget`: a whole number is tokens, a number below 1 a share of
the window, e.g. ``{"history": 32000, "memory": 0.05}``; ``trim_at`` and
``summarise_at`` move the two watermarks (shares of the history partition), and
``summarise_ahead_at`` the one where a summary is prepared off the critical path.

Pure Python (no Django), so the configuration checks and the engine share it.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

PARTITIONS = ("system", "memory", "history", "input", "buffer")
DEFAULT_SHARES: dict[str, float] = {
    "system": 8 / 128,
    "memory": 16 / 128,
    "history": 64 / 128,
    "input": 36 / 128,
    "buffer": 4 / 128,
}
TRIM_AT = 0.6
SUMMARISE_AT = 0.9
# Past this share (after trimming) a summary is prepared in the background, ready for
# the step that reaches `summarise_at` (engine/phases/after_turn.py).
SUMMARISE_AHEAD_AT = 0.6
WATERMARKS = ("trim_at", "summarise_ahead_at", "summarise_at")


@dataclass(frozen=True)
class ContextBudget:
    """Token limits for one request; every partition is a whole number of tokens."""

    window: int
    system: int
    memory: int
    history: int
    input: int
    buffer: int
    trim_at: float = TRIM_AT
    summarise_at: float = SUMMARISE_AT
    summarise_ahead_at: float = SUMMARISE_AHEAD_AT

    def partitions(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in PARTITIONS}


def _tokens(value: Any, window: int) -> int:
    number = float(value)
    return int(number * window) if 0 < number < 1 else int(number)


def context_budget(window: int, overrides: Mapping[str, Any] | None = None) -> ContextBudget:
    """The partitions of `window` with the agent's overrides applied.

    1. Each partition: the override (tokens, or a share below 1), else its default share.
    2. If they add up to more than the window, the history gives way first, then
       memory, then the buffer, so the window stays a hard limit.
    """
    overrides = overrides or {}
    window = max(int(window), 1)
    sizes = {
        name: max(
            0,
            _tokens(overrides[name], window)
            if name in overrides
            else int(DEFAULT_SHARES[name] * window),
        )
        for name in PARTITIONS
    }
    excess = sum(sizes.values()) - window
    for name in ("history", "memory", "buffer", "input", "system"):
        if excess <= 0:
            break
        give = min(excess, sizes[name])
        sizes[name] -= give
        excess -= give
    trim_at = float(overrides.get("trim_at", TRIM_AT))
    summarise_at = float(overrides.get("summarise_at", SUMMARISE_AT))
    ahead = float(overrides.get("summarise_ahead_at", min(SUMMARISE_AHEAD_AT, summarise_at)))
    return ContextBudget(
        window=window,
        trim_at=trim_at,
        summarise_at=summarise_at,
        summarise_ahead_at=ahead,
        **sizes,
    )


def budget_problems(overrides: Any) -> list[str]:
    """What is wrong with an agent's `context_budget` (empty when it is usable)."""
    if not isinstance(overrides, Mapping):
        return ['must be an object such as {"history": 32000}']
    problems: list[str] = []
    for key, value in overrides.items():
        if key not in PARTITIONS and key not in WATERMARKS:
            known = ", ".join(PARTITIONS + WATERMARKS)
            problems.append(f"unknown key '{key}' (known: {known})")
        elif isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            problems.append(f"'{key}' must be a number of at least 0")
        elif key in WATERMARKS and not 0 < value <= 1:
            problems.append(f"'{key}' must be a share between 0 and 1")
    trim = overrides.get("trim_at", TRIM_AT)
    summarise = overrides.get("summarise_at", SUMMARISE_AT)
    if not problems and trim > summarise:
        problems.append("'trim_at' must not be above 'summarise_at'")
    ahead = overrides.get("summarise_ahead_at", min(SUMMARISE_AHEAD_AT, summarise))
    if not problems and ahead > summarise:
        problems.append("'summarise_ahead_at' must not be above 'summarise_at'")
    return problems
