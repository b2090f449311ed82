"""A workflow run on its session's page: the graph with visited, active and failed nodes
coloured, and per node what went in and what came out, with the checkpoint to fork from."""

import json
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.utils.safestring import SafeString, mark_safe

from record.models import Checkpoint, Event, ModelCall, Session, ToolCall
from workflows.selectors import run_graph_svg

from ..status import Status, node_status

OUTPUT_PREVIEW_CHARS = 4000


@dataclass
class NodeRow:
    node: str
    kind: str = ""
    visits: int = 0
    status: str = ""
    input: str = ""
    output: str = ""
    error: str = ""
    step: int | None = None  # the checkpoint of the step that settled it (fork from there)
    next: str = ""
    # From its first start to its last end (its visits and the waits between them), and the
    # model calls of the steps that settled it: what the graph shows on the node.
    started_at: datetime | None = None
    ended_at: datetime | None = None
    cost: Decimal = Decimal(0)
    # Its longest call's own time: a read-only call the node step ran itself starts and ends the
    # node in one commit, so the events alone would say 0 ms.
    calls_ms: int = 0

    @property
    def duration(self) -> str:
        if self.started_at is None or self.ended_at is None:
            return ""
        span = (self.ended_at - self.started_at).total_seconds() * 1000
        ms = max(span, self.calls_ms)
        return f"{ms:.0f} ms" if ms < 10_000 else f"{ms / 1000:.1f} s"

    @property
    def status_word(self) -> Status:
        return node_status(self.status, self.kind)

    @property
    def cost_label(self) -> str:
        return f"{self.cost:.6f}".rstrip("0").rstrip(".") if self.cost else ""


@dataclass
class WorkflowRunView:
    slug: str
    version: int
    svg: SafeString
    rows: list[NodeRow] = field(default_factory=list)
    active: list[str] = field(default_factory=list)
    result: str = ""
    error: str = ""

    @property
    def panel(self) -> dict[str, dict[str, Any]]:
        """Per node what the panel beside the graph shows on a click, embedded in the page
        as JSON (json_script) and written into the panel as text, never as markup."""
        return {
            r.node: {
                "node": r.node,
                "kind": r.kind,
                "status": r.status_word.label,
                "colour": r.status_word.colour,
                "visits": r.visits,
                "duration": r.duration,
                "cost": r.cost_label,
                "input": r.input,
                "output": r.output,
                "error": r.error,
                "next": r.next,
                "step": f"step {r.step}" if r.step else "",
            }
            for r in self.rows
        }


def _text(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, indent=1)
    return text if len(text) <= OUTPUT_PREVIEW_CHARS else text[:OUTPUT_PREVIEW_CHARS] + " …"


def _inputs(session: Session, rows: dict[str, NodeRow]) -> None:
    """Each node's calls' arguments, in the order they were opened: a map's items and a
    parallel node's branches are named (`item 2: {...}`, `fast: {...}`), one line each."""
    for call_id, arguments in (
        ToolCall.objects.filter(session=session)
        .order_by("step", "position")
        .values_list("call_id", "input")
    ):
        if "~" in call_id:  # a retry's pause, not the node's own call
            continue
        inner, _, visit = call_id.partition("#")
        node_id, _, branch = inner.partition(".")
        row = rows.get(node_id)
        if row is None or len(row.input) > OUTPUT_PREVIEW_CHARS:
            continue
        item = visit.partition("[")[2].rstrip("]")
        if item or branch:
            label = f"item {item}" if item else branch
            text = f"{label}: {json.dumps(arguments, ensure_ascii=False, sort_keys=True)}"
        else:
            text = _text(arguments)
        row.input = f"{row.input}\n{text}" if row.input else text
        if len(row.input) > OUTPUT_PREVIEW_CHARS:
            row.input = row.input[:OUTPUT_PREVIEW_CHARS] + " …"


def workflow_run_view(session: Session, *, content: bool) -> WorkflowRunView:
    """Read the run's node events, checkpoints and calls; `content` False (no right to
    read what messages say) leaves inputs and outputs out."""
    version = session.workflow_version
    assert version is not None
    state = session.workflow_state or {}
    rows: dict[str, NodeRow] = {}
    for kind, data, at in (
        Event.objects.filter(
            session=session, type__in=["node.started", "node.finished", "node.failed"]
        )
        .order_by("seq")
        .values_list("type", "data", "created_at")
    ):
        row = rows.setdefault(str(data.get("node")), NodeRow(node=str(data.get("node"))))
        if kind == "node.started":
            row.started_at = row.started_at or at
        else:
            row.ended_at = at
        if kind == "node.started":
            row.kind = str(data.get("kind", ""))
            row.visits = max(row.visits, int(data.get("visit") or 1))
            row.status = "active"
        elif kind == "node.finished":
            row.status = "visited"
            # A condition or a wait node writes nothing: no "null" to read.
            output = data.get("output")
            row.output = _text(output) if content and output is not None else ""
            row.next = str(data.get("next", ""))
        else:
            row.status = "failed"
            row.error = str(data.get("error", ""))
    costs: dict[int, Decimal] = {}
    for step, cost in ModelCall.objects.filter(session=session).values_list("step", "cost"):
        costs[step] = costs.get(step, Decimal(0)) + cost
    for step, context in (
        Checkpoint.objects.filter(session=session, context__has_key="workflow")
        .order_by("step")
        .values_list("step", "context")
    ):
        settled = [n for n in context.get("nodes") or [] if n in rows]
        for node_id in settled:
            rows[node_id].step = step
            # The step's model calls, shared by the nodes it settled.
            rows[node_id].cost += costs.get(step, Decimal(0)) / len(settled)
    for call_id, elapsed in ToolCall.objects.filter(session=session).values_list(
        "call_id", "elapsed_ms"
    ):
        row = rows.get(call_id.partition("#")[0].partition(".")[0])
        if row is not None and "~" not in call_id:
            row.calls_ms = max(row.calls_ms, elapsed or 0)
    if content:
        _inputs(session, rows)
    error = state.get("error")
    # A failed run keeps its failed node among the active ones (a resume runs it again):
    # it is not waiting for anything.
    failed = error.get("node") if isinstance(error, dict) else None
    active = [n for n in state.get("active") or [] if n != failed]
    for node_id in active:
        if node_id in rows:
            rows[node_id].status = "active"
    svg = run_graph_svg(session, link=lambda n: f"#node-{n}")
    return WorkflowRunView(
        slug=version.workflow.slug,
        version=version.number,
        # Drawn by our own code from the stored definition; every text in it is escaped there.
        svg=mark_safe(svg),  # noqa: S308  # nosec B308 B703
        rows=list(rows.values()),
        active=active,
        result=_text(state.get("result")) if content and "result" in state else "",
        error=f"{error.get('node')}: {error.get('message')}" if isinstance(error, dict) else "",
    )
