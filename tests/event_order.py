"""Checks the order of a session's persisted events (tests only).

A watcher renders the stream as it comes (the playground, a client): node events must nest
and follow the path the run took, and a turn's `turn.finished` must close it. The rules,
checked over the events in `seq` order:

- a `node.finished` follows its node's `node.started` (or, for a resumed run, its earlier
  `node.failed`: the node runs again without a second start); a `node.failed` closes its
  open node, or fails a node that never started (a deadline, max_visits) while none is open;
- a node starts only once the node before it on the path finished: at most one top-level
  node is open at a time;
- while a node is open the run does not answer (no assistant `message.completed`) and does
  not move to `finished` or `error`;
- `turn.finished` is the last event of its turn: nothing of the run (node, tool, assistant
  or tool message, another `turn.finished`) comes after it before a new turn starts.
"""

from collections.abc import Iterable
from typing import Any

# The moves that start a new turn; anything else after `turn.finished` still belongs to it.
TURN_STARTS = {"user_message", "resume", "operator_answer", "hand_back"}
# What only a running turn writes.
TURN_EVENTS = {
    "node.started",
    "node.finished",
    "node.failed",
    "tool.started",
    "tool.finished",
    "turn.finished",
    "message.delta",
}


def event_order_problems(events: Iterable[tuple[int, str, Any]]) -> list[str]:
    """What is out of order among one session's events, given as (seq, type, data)."""
    problems: list[str] = []
    open_nodes: list[str] = []
    last_failed: str | None = None
    closed_at: int | None = None  # the seq of the turn.finished that closed the turn
    for seq, type_, data in sorted(events, key=lambda e: e[0]):
        data = data if isinstance(data, dict) else {}
        if type_ == "state.changed" and data.get("trigger") in TURN_STARTS:
            closed_at = None
        if closed_at is not None and (
            type_ in TURN_EVENTS
            or (type_ == "message.completed" and data.get("role") in ("assistant", "tool"))
        ):
            problems.append(f"#{seq} {type_} after the turn finished (#{closed_at})")
        node = str(data.get("node", ""))
        if type_ == "node.started":
            if "." not in node and open_nodes:
                problems.append(f"#{seq} node.started {node} while {open_nodes} is still open")
            open_nodes.append(node)
        elif type_ in ("node.finished", "node.failed"):
            if node in open_nodes:
                open_nodes.remove(node)
            elif type_ == "node.finished" and node != last_failed:
                problems.append(f"#{seq} node.finished {node} before its node.started")
            elif open_nodes:
                # A node that fails before it starts (a deadline, max_visits) fails alone.
                problems.append(f"#{seq} node.failed {node} while {open_nodes} is open")
            last_failed = node if type_ == "node.failed" else None
        elif type_ == "message.completed" and data.get("role") == "assistant" and open_nodes:
            problems.append(f"#{seq} the answer while {open_nodes} is still open")
        elif (
            type_ == "state.changed"
            and data.get("to") in ("finished", "error")
            and data.get("trigger") != "cancel"
            and open_nodes
        ):
            problems.append(f"#{seq} the run moved to {data.get('to')} while {open_nodes} is open")
        elif type_ == "turn.finished":
            if open_nodes and data.get("stop_reason") == "answer":
                problems.append(f"#{seq} turn.finished while {open_nodes} is still open")
            open_nodes = []
            closed_at = seq
    return problems


def assert_events_in_order(session_id: Any = None) -> None:
    """Every session's events (or one session's) are in order; the failure lists what is not."""
    from record.models import Event

    rows = Event.objects.order_by("session_id", "seq")
    if session_id is not None:
        rows = rows.filter(session_id=session_id)
    by_session: dict[Any, list[tuple[int, str, Any]]] = {}
    for session, seq, type_, data in rows.values_list("session_id", "seq", "type", "data"):
        by_session.setdefault(session, []).append((seq, type_, data))
    problems = [
        f"session {session}: {problem}"
        for session, events in by_session.items()
        for problem in event_order_problems(events)
    ]
    assert not problems, "events out of order:\n" + "\n".join(problems[:20])
