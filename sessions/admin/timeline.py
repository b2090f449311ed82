"""A session's timeline as the operator reads it: one line per stored row, merged by time."""

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.conf import settings
from django.urls import reverse
from django.utils import timezone

from record.events import EventType
from tools.rendering import FAILURE_MARKER

from .. import selectors
from ..status import Status, call_status, node_status
from .display import HIDDEN, arguments_diff, event_summary, pretty_json, short

TIMELINE_LIMIT = 500
# What was said, per kind of row: shown only with the message content permission.
CONTENT_KEYS = {
    "message": ("content", "tool_calls", "data"),
    "toolcall": ("input", "output", "error"),
    "event": ("data",),
    "checkpoint": ("context",),
}


@dataclass
class TimelineItem:
    at: datetime
    rank: int
    order: int
    kind: str
    label: str
    seq: int | None
    summary: str
    detail: str
    url: str
    state: str = ""
    day_label: str = ""
    trace_id: str = ""  # an event of a traced turn: its trace, linked through TRACE_URL_TEMPLATE
    trace_url: str = ""
    # "failed": something did not run or did not succeed (the row is drawn red); "warn": a
    # turn stopped short, an approval refused (amber); "": as usual.
    tone: str = ""
    # The workflow node the row belongs to (its event's node, its call's), "" if none; on a
    # node's own event, which one (started, finished, failed) and the visit it starts.
    node: str = ""
    mark: str = ""
    visit: int = 0
    node_kind: str = ""

    @property
    def time_label(self) -> str:
        local = timezone.localtime(self.at)
        return local.strftime("%H:%M:%S.") + f"{local.microsecond // 1000:03d}"


KINDS = {
    "transition": ("Transition", 0),
    "message": ("Message", 1),
    "toolcall": ("Tool call", 2),
    "event": ("Event", 3),
    "checkpoint": ("Checkpoint", 4),
}


def _summary(entry: selectors.TimelineEntry, content: bool) -> str:
    r = entry.row
    if entry.kind == "transition":
        summary = f"{r['from_state']} → {r['to_state']} ({r['trigger']})"
        if r["reason"]:
            summary += f": {short(r['reason'], 120)}"
        # A reason that already names who ("refund: approved by alice") is not told twice.
        if r["actor"] and not r["reason"].endswith(f"by {r['actor']}"):
            summary += f" by {r['actor']}"
        return summary
    if entry.kind == "message":
        who = r["role"] + (f" ({r['name']})" if r["name"] else "")
        summary = f"{who}: {short(r['content'], 200) if content else HIDDEN}"
        calls = [c.get("name", "?") for c in r["tool_calls"] or [] if isinstance(c, dict)]
        if calls:
            summary += " → " + ", ".join(map(str, calls))
        if r["status"] == "queued":
            summary += " [queued]"
        if r.get("archived_at"):
            summary += " [archived: a summary replaced it]"
        return summary
    if entry.kind == "toolcall":
        said = call_status(r["status"], r.get("refusal") or "", waiting=bool(r.get("waiting")))
        summary = f"{r['tool_name']}({short(r['input'], 100) if content else '…'}) {said.label}"
        if r.get("proposed_input") is not None:
            edit = arguments_diff(r["proposed_input"], r["input"]) if content else "…"
            summary += f" · ran with an approver's edit: {edit}"
        if r.get("risk_level") is not None:
            summary += f" · risk {r['risk_level']} ({r['risk_reason']})"
        if r["elapsed_ms"] is not None:
            summary += f" in {r['elapsed_ms']} ms"
        if r["error"] and content:
            summary += f": {short(r['error'], 100)}"
        return summary
    if entry.kind == "event":
        return f"{r['type']} · {event_summary(r['type'], r['data'], content=content)}"
    context = r["context"] if isinstance(r["context"], dict) else {}
    summary = (
        f"step {r['step']} · {r['state']} · {context.get('phase', '')} · {r['size_bytes']} bytes"
    )
    tokens = context.get("context")
    if isinstance(tokens, dict):
        summary += " · " + context_tokens(tokens)
    return summary


def _tone(entry: selectors.TimelineEntry) -> str:
    """Whether the row tells of something that did not run or did not succeed."""
    r = entry.row
    if entry.kind == "toolcall":
        return "failed" if call_status(r["status"], r.get("refusal") or "").tone == "failed" else ""
    if entry.kind == "transition":
        return "failed" if r["to_state"] == "error" else ""
    if entry.kind == "message":
        failed = r["role"] == "tool" and str(r["content"] or "").startswith(FAILURE_MARKER)
        return "failed" if failed else ""
    if entry.kind == "event":
        data = r["data"] if isinstance(r["data"], dict) else {}
        if r["type"] == EventType.TOOL_FINISHED:
            status = call_status(str(data.get("status")), str(data.get("refusal") or ""))
            return "failed" if status.tone == "failed" else ""
        if r["type"] == EventType.TURN_FINISHED:
            outcome = data.get("outcome")
            return {"tool_failures": "failed", "error": "failed", "stopped": "warn"}.get(
                str(outcome), ""
            )
        if r["type"] == EventType.ERROR:
            return "failed"
    return ""


NODE_MARKS = {
    EventType.NODE_STARTED: "started",
    EventType.NODE_FINISHED: "finished",
    EventType.NODE_FAILED: "failed",
}


def _call_node(call_id: Any) -> str:
    """The node a workflow call belongs to: `notify#1[2]` (a map's item), `fan.fast#1` (a
    parallel branch), `lookup#1~retry1` (a retry's pause) all belong to their node."""
    return str(call_id or "").partition("#")[0].partition(".")[0].partition("~")[0]


def _node_of(entry: selectors.TimelineEntry) -> tuple[str, str, int, str]:
    """(node, mark, visit, node kind) of a stored row, as TimelineItem keeps them."""
    r = entry.row
    data: dict[str, Any] = r["data"] if isinstance(r.get("data"), dict) else {}
    if entry.kind == "event":
        if r["type"] in NODE_MARKS:
            mark, visit = NODE_MARKS[r["type"]], int(data.get("visit") or 1)
            return str(data.get("node", "")), mark, visit, str(data.get("kind", ""))
        return _call_node(data.get("call_id")), "", 0, ""
    if entry.kind == "toolcall":
        return _call_node(r.get("call_id")), "", 0, ""
    if entry.kind == "message":
        return _call_node(r.get("tool_call_id")), "", 0, ""
    if entry.kind == "checkpoint" and isinstance(r.get("context"), dict):
        settled = r["context"].get("nodes")  # the nodes the step settled
        return (str(settled[0]) if isinstance(settled, list) and settled else ""), "", 0, ""
    return "", "", 0, ""


@dataclass
class TimelineGroup:
    """A node's visit on the timeline (node.started … node.finished and the rows between),
    or (node "") the run's own rows outside any node."""

    node: str
    visit: int = 0
    state: str = ""  # visited, active, failed (node_status)
    kind: str = ""
    items: list[TimelineItem] = field(default_factory=list)

    @property
    def status(self) -> Status:
        return node_status(self.state, self.kind)


def group_by_node(items: list[TimelineItem]) -> list[TimelineGroup]:
    """The timeline (sorted) grouped under the node each row belongs to, in the order the
    path was taken: a node visited again is a new group; a retry or a map's items stay in
    their node's. A row of no node goes to the node most recently started and still open
    (an approval, a transition), else to a group of the run's own rows."""
    started = {i.node for i in items if i.mark == "started"}
    groups: list[TimelineGroup] = []
    open_: dict[str, TimelineGroup] = {}
    last: dict[str, TimelineGroup] = {}
    # Rows of one commit share a time and sort by kind: a node's call can come before the
    # node.started of the same step. They wait for it.
    waiting: dict[str, list[TimelineItem]] = {}
    for item in items:
        node = item.node
        if item.mark == "started" and node not in open_:
            group = TimelineGroup(
                node=node, visit=item.visit, state="active", kind=item.node_kind, items=[item]
            )
            group.items += waiting.pop(node, [])
            groups.append(group)
            open_[node] = last[node] = group
            continue
        if node in open_ or node in last:
            group = open_.get(node) or last[node]
        elif node in started:
            waiting.setdefault(node, []).append(item)
            continue
        elif open_:
            group = list(open_.values())[-1]
        else:
            if not groups or groups[-1].node:
                groups.append(TimelineGroup(node=""))
            group = groups[-1]
        group.items.append(item)
        if item.mark in ("finished", "failed") and open_.get(node) is group:
            group.state = "visited" if item.mark == "finished" else "failed"
            del open_[node]
    return groups


def context_tokens(tokens: dict[str, Any]) -> str:
    """The partitions a model step's request used, e.g. `tokens: system 120 · memory 0 · ...`."""
    parts = [
        f"{name} {tokens.get(name, 0):,}"
        for name in ("system", "memory", "history", "input")
        if name in tokens
    ]
    line = "tokens: " + " · ".join(parts)
    if "history_limit" in tokens:
        line += f" (history limit {tokens['history_limit']:,}"
        if tokens.get("left_out"):
            line += f", {tokens['left_out']} messages left out"
        line += ")"
    if "window" in tokens:
        line += f" of a {tokens['window']:,} window"
    return line


def _detail(entry: selectors.TimelineEntry, content: bool) -> str:
    row = entry.row
    if not content:
        hide = CONTENT_KEYS.get(entry.kind, ())
        row = {key: HIDDEN if key in hide else value for key, value in row.items()}
    return pretty_json(row)


def session_timeline(
    session_id: Any, limit: int = TIMELINE_LIMIT, *, content: bool = True
) -> tuple[list[TimelineItem], bool]:
    """The last `limit` things that happened to a session, oldest first; True if older ones
    exist. With `content` False nothing of what was said shows (summaries and details)."""
    timeline = selectors.session_timeline(session_id=session_id, limit=limit)
    urls = {kind: reverse(f"admin:agent_sessions_{kind}_changelist") for kind in KINDS}
    items: list[TimelineItem] = []
    for entry in timeline.entries:
        label, rank = KINDS[entry.kind]
        item = TimelineItem(
            at=entry.at,
            rank=rank,
            order=entry.order,
            kind=entry.kind,
            label=label,
            seq=entry.seq,
            summary=_summary(entry, content),
            detail=_detail(entry, content),
            url=f"{urls[entry.kind]}{entry.pk}/change/",
            state=entry.state,
            tone=_tone(entry),
        )
        item.node, item.mark, item.visit, item.node_kind = _node_of(entry)
        if entry.kind == "event" and isinstance(entry.row.get("data"), dict):
            item.trace_id = str(entry.row["data"].get("trace_id") or "")
            item.trace_url = trace_url(item.trace_id)
        items.append(item)
    # Approvals and reviews sit inline, where they were asked for and decided.
    since = items[0].at if timeline.truncated and items else None
    items += approval_items(session_id, since, content=content)
    items.sort(key=lambda i: (i.at, i.rank, i.order))
    day = ""
    for item in items:
        this_day = timezone.localtime(item.at).strftime("%Y-%m-%d")
        if this_day != day:
            item.day_label = day = this_day
    return items, timeline.truncated


def trace_url(trace_id: str) -> str:
    """The trace UI's page for a trace id (TRACE_URL_TEMPLATE), "" without a template or id."""
    template = settings.TRACE_URL_TEMPLATE
    return template.replace("{trace_id}", trace_id) if template and trace_id else ""


def approval_items(
    session_id: Any, since: Any = None, *, content: bool = True
) -> list[TimelineItem]:
    """One line per approval asked for, and one per decision (its arguments are what the
    model said: shown only with `content`)."""
    from approvals.models import Approval

    rows = Approval.objects.filter(session_id=session_id).order_by("requested_at")
    if since is not None:
        rows = rows.filter(requested_at__gte=since)
    items: list[TimelineItem] = []
    for a in rows[:TIMELINE_LIMIT]:
        url = reverse("admin:approvals_approval_change", args=[a.pk])
        # A recovery review asks whether an uncertain call took effect, or whether a call
        # whose precheck failed is sent: its reason says which.
        what = "recovery review" if a.kind == "recovery_review" else "approval"
        detail = pretty_json(
            {"arguments": a.arguments, "edited_arguments": a.edited_arguments, "reason": a.reason}
            if content
            else {"arguments": HIDDEN, "edited_arguments": HIDDEN, "reason": a.reason}
        )
        arguments = short(a.arguments, 80) if content else "…"
        items.append(
            TimelineItem(
                at=a.requested_at, rank=5, order=0, kind="approval", label="Approval", seq=None,
                summary=f"{what} {a.tool_name}({arguments}) · risk {a.risk_level} "
                f"· group {a.group} · {a.status}",
                detail=detail, url=url,
            )
        )  # fmt: skip
        if a.decided_at is not None:
            outcome = a.status + (f" ({a.get_answer_display()})" if a.answer else "")
            edits = " with edited arguments" if a.edited_arguments is not None else ""
            comment = f': "{short(a.comment, 80)}"' if a.comment else ""
            items.append(
                TimelineItem(
                    at=a.decided_at, rank=5, order=1, kind="approval", label="Approval", seq=None,
                    summary=f"{a.tool_name} {outcome}{edits} by {a.decided_by_name}{comment}",
                    detail=detail, url=url,
                    tone="warn" if a.status in ("rejected", "expired") else "",
                )
            )  # fmt: skip
    return items
