"""Turning a structured tool result into compact text a model reads well.

Key facts (scalars) come first, then lists as counts plus one short line per
item, capped; a failed result starts with an unmistakable marker and its
status, so the model cannot mistake it for success. The result (cut to
TOOL_RESULT_MAX_BYTES, tools/result_limits.py) stays on
the ToolCall row.
"""

import json
from typing import Any

from .result_limits import CUT_KEY, PARTIAL_KEY, is_cut

FAILURE_MARKER = "[FAILED]"
MAX_CHARS = 4000
MAX_ITEMS = 20
MAX_VALUE_CHARS = 300


def _scalar(value: Any) -> str:
    if isinstance(value, str):
        text = value
    else:
        text = json.dumps(value, ensure_ascii=False, default=str, separators=(",", ":"))
    if len(text) <= MAX_VALUE_CHARS:
        return text
    return text[:MAX_VALUE_CHARS] + f"… [cut: {len(text) - MAX_VALUE_CHARS} more characters]"


def _is_scalar(value: Any) -> bool:
    return value is None or isinstance(value, str | int | float | bool)


def _item_line(item: Any) -> str:
    if isinstance(item, dict):
        return "; ".join(f"{k}: {_scalar(v)}" for k, v in item.items())
    return _scalar(item)


def render_success(output: dict[str, Any], *, cached: bool = False) -> str:
    lines: list[str] = ["(cached result from an identical earlier call)"] if cached else []
    if is_cut(output):
        return _render_cut(output, lines)
    scalars = [(k, v) for k, v in output.items() if _is_scalar(v)]
    nested = [(k, v) for k, v in output.items() if not _is_scalar(v)]
    if scalars:
        lines.append(", ".join(f"{k}: {_scalar(v)}" for k, v in scalars))
    for key, value in nested:
        if isinstance(value, list):
            lines.append(f"{key}: {len(value)} item{'s' if len(value) != 1 else ''}")
            lines += [f"- {_item_line(item)}" for item in value[:MAX_ITEMS]]
            if len(value) > MAX_ITEMS:
                lines.append(f"- … {len(value) - MAX_ITEMS} more not shown")
        elif isinstance(value, dict):
            lines.append(f"{key}: {_item_line(value)}")
    text = "\n".join(lines) or "(empty result)"
    return cap(text)


def _render_cut(output: dict[str, Any], lines: list[str]) -> str:
    """A cut result (tools/result_limits.py): its marker first, so no cap hides it, then
    as much of the start of the result as fits."""
    lines = [*lines, str(output[CUT_KEY].get("note", "")), "Start of the result:"]
    head = "\n".join(lines) + "\n"
    partial = output[PARTIAL_KEY]
    room = MAX_CHARS - len(head)
    if len(partial) > room:
        partial = partial[: max(room - 1, 0)] + "…"
    return head + partial


def render_failure(status: str, message: str) -> str:
    return cap(f"{FAILURE_MARKER} (status: {status}): {message}")


def cap(text: str, limit: int = MAX_CHARS) -> str:
    if len(text) <= limit:
        return text
    cut = len(text) - limit
    return text[:limit] + f"\n[cut: {cut} more characters not shown; the full result is stored]"
