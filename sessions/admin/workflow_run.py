"""A workflow run on its session's page: the graph with visited, active and failed nodes
coloured, and per node what went in and what came out, with the checkpoint to fork from."""

import json
from dataclasses import dataclass, field
from typing import Any

from django.utils.safestring import SafeString, mark_safe

from workflows.selectors import run_graph_svg

from ..models import Checkpoint, Event, Session, ToolCall

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


@dataclass
class WorkflowRunView:
    slug: str
    version: int
    svg: SafeString
    rows: list[NodeRow] = field(default_factory=list)
    active: list[str] = field(default_factory=list)
    result: str = ""
    error: str = ""


def _text(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, indent=1)
    return text if len(text) <= OUTPUT_PREVIEW_CHARS else text[:OUTPUT_PREVIEW_CHARS] + " …"


def workflow_run_view(session: Session, *, content: bool) -> WorkflowRunView:
    """Read the run's node events, checkpoints and calls; `content` False (no right to
    read what messages say) leaves inputs and outputs out."""
    version = session.workflow_version
    assert version is not None
    state = session.workflow_state or {}
    rows: dict[str, NodeRow] = {}
    for kind, data in (
        Event.objects.filter(
            session=session, type__in=["node.started", "node.finished", "node.failed"]
        )
        .order_by("seq")
        .values_list("type", "data")
    ):
        row = rows.setdefault(str(data.get("node")), NodeRow(node=str(data.get("node"))))
        if kind == "node.started":
            row.kind = str(data.get("kind", ""))
            row.visits = max(row.visits, int(data.get("visit") or 1))
            row.status = "active"
        elif kind == "node.finished":
            row.status = "visited"
            row.output = _text(data.get("output")) if content else ""
            row.next = str(data.get("next", ""))
        else:
            row.status = "failed"
            row.error = str(data.get("error", ""))
    for step, context in (
        Checkpoint.objects.filter(session=session, context__has_key="workflow")
        .order_by("step")
        .values_list("step", "context")
    ):
        for node_id in context.get("nodes") or []:
            if node_id in rows:
                rows[node_id].step = step
    if content:
        for call_id, arguments in ToolCall.objects.filter(session=session).values_list(
            "call_id", "input"
        ):
            node_id = call_id.partition("#")[0]
            if node_id in rows and "~" not in call_id:
                row = rows[node_id]
                row.input = (
                    _text(arguments) if not row.input else row.input + "\n" + _text(arguments)
                )
    for node_id in state.get("active") or []:
        if node_id in rows and rows[node_id].status != "failed":
            rows[node_id].status = "active"
    svg = run_graph_svg(session, link=lambda n: f"#node-{n}")
    error = state.get("error")
    return WorkflowRunView(
        slug=version.workflow.slug,
        version=version.number,
        # Drawn by our own code from the stored definition; every text in it is escaped there.
        svg=mark_safe(svg),  # noqa: S308  # nosec B308 B703
        rows=list(rows.values()),
        active=list(state.get("active") or []),
        result=_text(state.get("result")) if content and "result" in state else "",
        error=f"{error.get('node')}: {error.get('message')}" if isinstance(error, dict) else "",
    )
