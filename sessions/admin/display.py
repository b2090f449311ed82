"""How the console shows values: badges, short text, JSON and links."""

import json
from typing import Any

from django.urls import reverse
from django.utils.html import format_html
from django.utils.text import Truncator

from record.events import EventType, call_counts, turn_outcome
from sessions.status import (
    Status,
    call_status,
    calls_line,
    outcome_status,
    session_status,
)

DETAIL_CHARS = 4000


def status_badge(status: Status, css: str = "ap-state", title: str = "") -> str:
    """A status (sessions/status.py) as a coloured pill, in the one vocabulary."""
    return format_html(
        '<span class="{}" style="background:{};color:#fff;padding:1px 7px;border-radius:9px;'
        'font-size:11px;white-space:nowrap" title="{}">{}</span>',
        css,
        status.colour,
        title,
        status.label,
    )


def state_badge(state: str, last_turn_outcome: str = "") -> str:
    """A session's state; once its turn ended, how it ended (a stopped turn is never green)."""
    return status_badge(session_status(state, last_turn_outcome))


def call_badge(status: str, refusal: str = "", *, waiting: bool = False) -> str:
    return status_badge(call_status(status, refusal, waiting=waiting), "ap-call")


def short(value: Any, length: int = 120) -> str:
    if value is None:
        return ""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return Truncator(" ".join(text.split())).chars(length)


def format_cost(value: Any) -> str:
    text = f"{value:.6f}".rstrip("0").rstrip(".")
    return text or "0"


def pretty_json(value: Any, limit: int = DETAIL_CHARS) -> str:
    text = json.dumps(value, ensure_ascii=False, indent=2, default=str)
    if len(text) > limit:
        text = text[:limit] + f"\n… ({len(text) - limit} more characters)"
    return text


def pre(value: Any) -> str:
    return format_html(
        '<pre style="margin:0;white-space:pre-wrap;max-width:90ch">{}</pre>',
        pretty_json(value, 50000),
    )


def session_link(session_id: object) -> str:
    url = reverse("admin:agent_sessions_session_change", args=[session_id])
    return format_html(
        '<a href="{}" title="{}"><code>{}</code></a>', url, session_id, str(session_id)[:8]
    )


def outcome_badge(stop_reason: str | None, last_error: str = "") -> str:
    """A turn known by its stop reason only (it ended before outcomes were recorded): the
    outcome that stop reason gives, in the one vocabulary, the error as its title."""
    if not stop_reason:
        return "—"
    outcome = turn_outcome(stop_reason, call_counts(()))
    return turn_outcome_badge(outcome, stop_reason=stop_reason, title=short(last_error, 300))


def turn_outcome_badge(
    outcome: str, calls: Any = None, stop_reason: str | None = None, title: str = ""
) -> str:
    """The last turn's outcome as a coloured badge, its calls and stop reason beside it."""
    if not outcome:
        return "—"
    parts = []
    if stop_reason and stop_reason != "answer":
        parts.append(stop_reason.replace("_", " "))
    line = calls_line(calls)
    if line and line != "no tool calls":
        parts.append(line)
    detail = " · ".join(parts)
    return format_html(
        "{}{}",
        status_badge(outcome_status(outcome), f"ap-turn-outcome ap-turn-{outcome}", title),
        format_html(' <span class="ap-turn-detail" style="font-size:11px">{}</span>', detail)
        if detail
        else "",
    )


def arguments_diff(before: Any, after: Any) -> str:
    """What an approver changed in a call's arguments: `key: old → new; ...`."""
    if not isinstance(before, dict) or not isinstance(after, dict):
        return f"{short(before, 80)} → {short(after, 80)}"
    missing = object()
    parts = []
    for key in dict.fromkeys([*before, *after]):
        old, new = before.get(key, missing), after.get(key, missing)
        if old == new:
            continue
        was = "(none)" if old is missing else short(old, 60)
        now = "(removed)" if new is missing else short(new, 60)
        parts.append(f"{key}: {was} → {now}")
    return "; ".join(parts) or "(no change)"


HIDDEN = "(content hidden)"


def event_summary(type_: str, data: dict[str, Any], *, content: bool = True) -> str:
    """One line for an event; with `content` False, nothing of what was said (for a user
    without the message content permission): states, names, counts and timings only."""
    if not isinstance(data, dict):
        return short(data) if content else HIDDEN
    if type_ == EventType.STATE_CHANGED:
        return f"{data.get('from')} → {data.get('to')} ({data.get('trigger')})"
    if type_ == EventType.MESSAGE_COMPLETED:
        calls = ", ".join(
            str(c.get("name", "?")) for c in data.get("tool_calls") or [] if isinstance(c, dict)
        )
        text = short(data.get("content"), 160) if content else HIDDEN
        return f"{data.get('role')}: {text}" + (f" → {calls}" if calls else "")
    if type_ == EventType.TOOL_STARTED:
        return f"{data.get('tool')}({short(data.get('input'), 100) if content else '…'})"
    if type_ == EventType.TOOL_FINISHED:
        error = data.get("error") if content else None
        status = call_status(str(data.get("status")), str(data.get("refusal") or "")).label
        line = f"{data.get('tool')} {status}"
        if data.get("elapsed_ms") is not None:
            line += f" in {data.get('elapsed_ms')} ms"
        if "proposed_input" in data:
            edit = arguments_diff(data.get("proposed_input"), data.get("input")) if content else "…"
            line += f" · ran with an approver's edit: {edit}"
        return line + (f": {short(error, 100)}" if error else "")
    if type_ == EventType.TURN_FINISHED:
        usage = data.get("usage") or {}
        outcome = data.get("outcome")
        return (
            f"turn {data.get('turn')} {data.get('stop_reason')}"
            + (
                f" · {outcome_status(str(outcome)).label} ({calls_line(data.get('calls'))})"
                if outcome
                else ""
            )
            + f", {data.get('iterations')} model call(s), "
            f"{usage.get('input_tokens', 0)}+{usage.get('output_tokens', 0)} tokens, cost {usage.get('cost', 0)}"
        )
    if type_ == EventType.ERROR:
        return f"{data.get('code')}: {short(data.get('message'), 160) if content else HIDDEN}"
    if type_ in (EventType.CHILD_STARTED, EventType.CHILD_FINISHED):
        state = data.get("state") if type_ == EventType.CHILD_FINISHED else "started"
        child = str(data.get("session") or "")[:8]
        return f"{data.get('agent')} {state} · session {child} · call {data.get('call_id')}"
    if type_ == EventType.AGENT_CHANGED:
        reason = short(data.get("reason"), 120) if content else HIDDEN
        return f"{data.get('from')} → {data.get('to')}: {reason}"
    return short(data, 160) if content else HIDDEN
