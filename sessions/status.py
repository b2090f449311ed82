"""One vocabulary of status: what every card, list, filter and badge calls a tool call's
status, a turn's outcome and a session's state, in words and in colour (the admin, the
playground and the approvals queue read it here; the playground as JSON).

A call is waiting for approval, running, ok, failed, rejected, expired or unpaid (the keys
of a turn's `calls` counts, record/events.py `call_kind`, plus the two open ones). A
turn's outcome is ok, tool failures, stopped or error. A session whose last turn ended
shows that turn's outcome, not its state's name: a turn stopped by a budget, a guard or a
cancel is amber "stopped", never a green "finished".
"""

from dataclasses import asdict, dataclass
from typing import Any

from record.events import call_kind


@dataclass(frozen=True)
class Status:
    label: str
    colour: str
    # What the row means to someone scanning a list: ok, running, waiting, failed, warn, quiet.
    tone: str


GREEN, BLUE, INDIGO, AMBER, ORANGE, RED, DARK_RED, GREY, TEAL = (
    "#15803d",
    "#2563eb",
    "#4f46e5",
    "#b45309",
    "#c2410c",
    "#dc2626",
    "#991b1b",
    "#6b7280",
    "#0f766e",
)

CALLS: dict[str, Status] = {
    "waiting": Status("waiting for approval", ORANGE, "waiting"),
    "running": Status("running", BLUE, "running"),
    "ok": Status("ok", GREEN, "ok"),
    "failed": Status("failed", RED, "failed"),
    "rejected": Status("rejected", RED, "failed"),
    "expired": Status("expired", RED, "failed"),
    "unpaid": Status("unpaid", RED, "failed"),
}

OUTCOMES: dict[str, Status] = {
    "ok": Status("ok", GREEN, "ok"),
    "tool_failures": Status("tool failures", RED, "failed"),
    "stopped": Status("stopped", AMBER, "warn"),
    "error": Status("error", DARK_RED, "failed"),
}

STATES: dict[str, Status] = {
    "idle": Status("idle", GREY, "quiet"),
    "processing": Status("calling the model", BLUE, "running"),
    "tool_wait": Status("running tools", INDIGO, "running"),
    "tool_loop": Status("reading tool results", INDIGO, "running"),
    "paused_for_user": Status("waiting for the user", AMBER, "waiting"),
    "awaiting_approval": Status("waiting for approval", ORANGE, "waiting"),
    "waiting_timer": Status("waiting for a timer", TEAL, "waiting"),
    "waiting_credits": Status("waiting for credits", TEAL, "waiting"),
    "error": Status("error", DARK_RED, "failed"),
    "finished": Status("finished", GREEN, "ok"),
    "cancelled": Status("cancelled", AMBER, "warn"),
}
# A session whose turn ended says how: the state `finished` alone would be green for all.
_ENDED = {
    "ok": STATES["finished"],
    "tool_failures": Status("finished with tool failures", RED, "failed"),
    "stopped": OUTCOMES["stopped"],
    "error": OUTCOMES["error"],
}
UNKNOWN = Status("unknown", GREY, "quiet")
# A workflow node's visit, in a call's words: it ran (ok), runs (running), failed.
NODES = {"visited": CALLS["ok"], "active": CALLS["running"], "failed": CALLS["failed"]}


def node_status(state: str, kind: str = "") -> Status:
    """A node's visit (visited, active, failed); an active human node waits for a person."""
    if state == "active" and kind == "human":
        return CALLS["waiting"]
    return NODES.get(state, UNKNOWN)


def call_key(status: str, refusal: str = "", *, waiting: bool = False) -> str:
    """A stored call's key in CALLS: an open call waits for approval or runs; an ended one
    counts as its turn's `calls` count it (ok, failed, rejected, expired, unpaid)."""
    if status == "executing":
        return "waiting" if waiting else "running"
    return call_kind(status, refusal)


def call_status(status: str, refusal: str = "", *, waiting: bool = False) -> Status:
    return CALLS[call_key(status, refusal, waiting=waiting)]


def outcome_status(outcome: str) -> Status:
    return OUTCOMES.get(outcome, UNKNOWN)


def session_status(state: str, last_turn_outcome: str = "") -> Status:
    """A session's badge: its state, or, once its turn ended (`finished`), that turn's outcome."""
    if state == "finished" and last_turn_outcome in _ENDED:
        return _ENDED[last_turn_outcome]
    return STATES.get(state, UNKNOWN)


def calls_line(calls: Any) -> str:
    """A turn's calls by how they ended, in CALLS' words and order (`1 ok · 3 rejected`);
    zeros left out; "no tool calls" when there were none."""
    if not isinstance(calls, dict):
        return ""
    parts = [f"{calls[k]} {s.label}" for k, s in CALLS.items() if calls.get(k)]
    return " · ".join(parts) or "no tool calls"


def vocabulary() -> dict[str, dict[str, dict[str, str]]]:
    """The whole vocabulary as JSON for the pages' scripts (the playground)."""
    return {
        "calls": {k: asdict(s) for k, s in CALLS.items()},
        "outcomes": {k: asdict(s) for k, s in OUTCOMES.items()},
        "states": {k: asdict(s) for k, s in STATES.items()},
        "ended": {k: asdict(s) for k, s in _ENDED.items()},
    }
