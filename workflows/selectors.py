"""Reads of workflows: a version's compiled definition, and the workflows a key may start."""

import threading
from collections.abc import Iterator, Mapping
from datetime import datetime
from typing import Any

from django.db.models import Aggregate, Count, F, FloatField, Q, QuerySet
from django.db.models.functions import Extract

from record.models import Agent, Event, ModelEndpoint, Session
from tools.execution import BUILTIN_TOOLS, ToolSnapshot
from tools.models import Tool

from .definition import Definition, definition_parse
from .graph_svg import REVISION, NodeMark, Picture, picture_svg, workflow_picture
from .models import Workflow, WorkflowPicture, WorkflowVersion

# A version never changes once stored, so its compiled form is kept for the process's life
# (bounded: the oldest go first).
_CACHE_MAX = 256
_compiled: dict[int, Definition] = {}
_lock = threading.Lock()
# Pictures likewise, bounded by their size: a 1,500-node one is megabytes.
_PICTURES_MAX_CHARS = 20_000_000
_pictures: dict[int, tuple[Picture, int]] = {}


def _named(raw: Any, key: str) -> Iterator[str]:
    """Every value of `key` in the nodes (inline ones too): the names a version refers to."""
    if isinstance(raw, Mapping):
        for name, value in raw.items():
            if name == key and isinstance(value, str):
                yield value
            else:
                yield from _named(value, key)
    elif isinstance(raw, list):
        for value in raw:
            yield from _named(value, key)


def definition_compile(raw: Mapping[str, Any], *, where: str) -> Definition:
    """A stored version, compiled without judging its references again: it was validated when
    stored, and what it names may have changed since (the tool phase still gates every call
    by the run's role, and a missing tool is a node failure the operator can read)."""
    nodes = raw.get("nodes") or {}
    return definition_parse(
        raw,
        where=where,
        known_tools={name: () for name in _named(nodes, "tool")},
        known_agents=set(_named(nodes, "agent")),
        known_models={*_named(nodes, "model"), *([raw["model"]] if raw.get("model") else [])},
    )


def version_definition(version_id: int) -> Definition:
    found = _compiled.get(version_id)
    if found is not None:
        return found
    version = WorkflowVersion.objects.select_related("workflow").get(pk=version_id)
    definition = definition_compile(
        version.definition, where=f"workflow {version.workflow.slug} v{version.number}"
    )
    with _lock:
        if len(_compiled) >= _CACHE_MAX:
            _compiled.pop(next(iter(_compiled)))
        _compiled[version_id] = definition
    return definition


def workflows_startable(*, key_roles: list[str]) -> QuerySet[Workflow]:
    """The enabled workflows whose role the key holds."""
    return Workflow.objects.filter(enabled=True, role__in=key_roles, current_version__gt=0)


def workflow_current_version(workflow: Workflow) -> WorkflowVersion:
    return WorkflowVersion.objects.get(workflow=workflow, number=workflow.current_version)


def tool_roles() -> dict[str, tuple[str, ...]]:
    """Each enabled tool's roles as the tool phase judges them (empty: every role)."""
    rows = Tool.objects.filter(enabled=True).select_related("mcp_server")
    found = {tool.name: ToolSnapshot.from_model(tool).roles for tool in rows}
    for name in BUILTIN_TOOLS:
        found.setdefault(name, ())
    return found


def definition_check(raw: Mapping[str, Any], *, where: str) -> Definition:
    """Parse and judge a definition against what exists now (the admin's edit; apply_config
    judges a file against the file and the database together). Raises WorkflowInvalid."""
    return definition_parse(
        raw,
        where=where,
        known_tools=tool_roles(),
        known_agents=set(
            Agent.objects.filter(enabled=True, workflow__isnull=True).values_list("slug", flat=True)
        ),
        known_models=set(ModelEndpoint.objects.values_list("name", flat=True)),
    )


def version_picture(version_id: int) -> Picture:
    """The version's picture as kept when it was stored (workflows/services.py), read once
    per process. A version stored before pictures were kept, or drawn by an older revision
    of the drawing, is drawn here, once per process."""
    found = _pictures.get(version_id)
    if found is not None:
        return found[0]
    drawing = (
        WorkflowPicture.objects.filter(version_id=version_id, revision=REVISION)
        .values_list("drawing", flat=True)
        .first()
    )
    if drawing is not None:
        picture = Picture.from_json(drawing)
    else:
        version = WorkflowVersion.objects.only("definition").get(pk=version_id)
        picture = workflow_picture(version.definition)
    size = len(picture.edges) + len(picture.labels) + 200 * len(picture.nodes)
    with _lock:
        while _pictures and sum(n for _p, n in _pictures.values()) + size > _PICTURES_MAX_CHARS:
            _pictures.pop(next(iter(_pictures)))
        _pictures[version_id] = (picture, size)
    return picture


def version_svg(version: WorkflowVersion) -> str:
    """The version drawn without a run (the workflow's admin page)."""
    return picture_svg(version_picture(version.pk))


NODE_EVENTS = ("node.started", "node.finished", "node.failed")


def run_node_marks(session: Session) -> dict[str, NodeMark]:
    """What the run did at each node, from its node events and where it stands now: visits,
    visited, active or failed (a branch `any` dropped: cancelled), and how long its last
    visit took."""
    visits: dict[str, int] = {}
    status: dict[str, str] = {}
    began: dict[str, datetime] = {}
    seconds: dict[str, float] = {}
    # Two keys of each event's data, not the data: a node's events may carry its output.
    for kind, name, visit, at in (
        Event.objects.filter(session=session, type__in=NODE_EVENTS)
        .order_by("seq")
        .values_list("type", "data__node", "data__visit", "created_at")
    ):
        node = "" if name is None else str(name)
        if kind == "node.started":
            visits[node] = max(visits.get(node, 0), int(visit or 1))
            status[node] = "active"
            began[node] = at
            seconds.pop(node, None)
        else:
            status[node] = "visited" if kind == "node.finished" else "failed"
            if node in began:
                seconds[node] = (at - began[node]).total_seconds()
    state = session.workflow_state or {}
    for node in state.get("active") or []:
        if status.get(node) != "failed":
            status[node] = "active"
    return {
        node: NodeMark(visits=visits.get(node, 0), status=s, seconds=seconds.get(node))
        for node, s in status.items()
    }


def run_graph_svg(session: Session, *, link: Any = None) -> str:
    """The run's version, as kept, with what the run did at each node drawn onto it."""
    assert session.workflow_version_id is not None
    picture = version_picture(session.workflow_version_id)
    return picture_svg(picture, marks=run_node_marks(session), link=link)


def workflow_definition_current(*, slug: str) -> dict[str, Any] | None:
    """The definition of the workflow's current version, as stored; None if it has none."""
    return (
        WorkflowVersion.objects.filter(workflow__slug=slug, number=F("workflow__current_version"))
        .values_list("definition", flat=True)
        .first()
    )


class _Median(Aggregate):
    """PostgreSQL's median of an expression (no such aggregate in Django)."""

    template = "percentile_cont(0.5) WITHIN GROUP (ORDER BY %(expressions)s)"
    output_field = FloatField()


def workflows_with_run_figures(queryset: QuerySet[Workflow]) -> QuerySet[Workflow]:
    """Each workflow with its runs, failed runs (its last turn ended in error) and the median
    duration of its ended runs in seconds (created to last update), over all its versions:
    aggregates in the list's own query, no query per row."""
    runs = "versions__runs"
    # An evaluation's replays of its runs (evaluations/workflow_replay.py) are not its runs.
    real = Q(**{f"{runs}__evaluation_id__isnull": True})
    failed = real & Q(**{f"{runs}__last_turn_outcome": "error"})
    ended = real & Q(**{f"{runs}__state__in": ["finished", "error", "cancelled"]})
    seconds = Extract(F(f"{runs}__updated_at") - F(f"{runs}__created_at"), "epoch")
    return queryset.annotate(
        run_count=Count(runs, filter=real),
        failed_count=Count(runs, filter=failed),
        median_s=_Median(seconds, filter=ended),
    )
