"""Tool calls per turn, counted in the process that runs them (agent_turn_tool_calls).

A dict per process, not a query: the count is observed when the turn ends in this
process. A turn whose tools ran on another worker (after an approval, a crash)
is counted by the part this process saw.
"""

import threading
from typing import Any

from . import metrics

_lock = threading.Lock()
_counts: dict[str, int] = {}
# A worker that never sees its turns end (the process stops) must not grow without bound.
MAX_TRACKED = 100_000


def tool_calls_count(session_id: Any, n: int) -> None:
    key = str(session_id)
    with _lock:
        if key in _counts or len(_counts) < MAX_TRACKED:
            _counts[key] = _counts.get(key, 0) + n


def turn_ended(session_id: Any, stop_reason: str) -> None:
    with _lock:
        n = _counts.pop(str(session_id), 0)
    metrics.TURN_TOOL_CALLS.observe(n)
    metrics.TURNS.labels(stop_reason).inc()
