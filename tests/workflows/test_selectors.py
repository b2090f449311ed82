"""Reads of workflows (workflows/selectors.py): a version's picture is kept, a run's marks
are drawn onto it."""

import datetime as dt
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from record.models import Event
from tests.factories import ModelEndpointFactory, ToolFactory, UserFactory, api_key_for
from tests.sessions.api.conftest import Api
from workflows import graph_svg, selectors
from workflows.models import Workflow, WorkflowPicture, WorkflowVersion
from workflows.selectors import definition_check, run_graph_svg
from workflows.services import workflow_apply, workflow_run_start

pytestmark = pytest.mark.django_db

SVG = "{http://www.w3.org/2000/svg}"

FLOW = """
slug: two-steps
role: support
start: first
nodes:
  first: {kind: tool, tool: clock, args: {}, output: now, next: check}
  check:
    kind: condition
    cases: [{when: "now.now != ''", next: second}]
    default: end
    max_visits: 3
  second: {kind: tool, tool: clock, args: {}, next: end}
"""


@pytest.fixture(autouse=True)
def _fresh_cache() -> Iterator[None]:
    # Pictures are kept per process: each test starts as a process that has read none.
    selectors._pictures.clear()
    yield
    selectors._pictures.clear()


@pytest.fixture
def layouts(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The slugs laid out, in order: a spy on the costly part, not a stand-in for it."""
    seen: list[str] = []
    real = graph_svg._Layout

    class Counting(real):  # type: ignore[misc,valid-type]
        def __init__(self, raw: Any) -> None:
            seen.append(str(raw.get("slug")))
            super().__init__(raw)

    monkeypatch.setattr(graph_svg, "_Layout", Counting)
    return seen


def _apply(text: str = FLOW) -> Workflow:
    ModelEndpointFactory()
    ToolFactory(name="clock", roles=["support"])
    raw = yaml.safe_load(text)
    workflow_apply(definition=definition_check(raw, where="t"), where="t", default_model="rules")
    return Workflow.objects.get(slug=raw["slug"])


def _run(api: Api) -> str:
    response = api.post("/api/v1/workflows/two-steps/runs/", {"input": {}})
    assert response.status_code == 201, response.content
    return str(response.json()["id"])


def test_a_version_is_laid_out_once_when_stored_never_per_request(layouts: list[str]) -> None:
    _apply()
    version = WorkflowVersion.objects.get(workflow__slug="two-steps")
    assert layouts == ["two-steps"]
    kept = WorkflowPicture.objects.get(version=version)
    assert kept.revision == graph_svg.REVISION
    support = Api(api_key_for("alice", roles=("support",)))
    run = _run(support)

    for _ in range(3):
        response = support.get(f"/api/v1/sessions/{run}/graph/")
        assert response.status_code == 200 and 'data-node="second"' in response.content.decode()

    assert layouts == ["two-steps"]  # the stored picture, read and coloured
    # A version stored again with the same definition is not drawn again either.
    _apply()
    assert layouts == ["two-steps"]


def test_a_version_without_a_kept_picture_is_laid_out_once_per_process(
    layouts: list[str],
) -> None:
    _apply()
    version = WorkflowVersion.objects.get(workflow__slug="two-steps")
    # Stored before pictures were kept, or drawn by an older revision of the drawing.
    WorkflowPicture.objects.filter(version=version).update(revision=graph_svg.REVISION - 1)
    layouts.clear()
    support = Api(api_key_for("alice", roles=("support",)))
    run = _run(support)

    for _ in range(3):
        assert support.get(f"/api/v1/sessions/{run}/graph/").status_code == 200

    assert layouts == ["two-steps"]


def test_the_admin_page_of_a_workflow_shows_the_kept_picture(layouts: list[str]) -> None:
    workflow = _apply()
    layouts.clear()
    version = WorkflowVersion.objects.get(workflow=workflow)

    svg = selectors.version_svg(version)

    assert layouts == []
    assert 'class="wf-graph"' in svg and "wf-run" not in svg
    # As drawn at once from the YAML: in the nodes' declared order, which the stored
    # definition (jsonb) does not keep.
    assert svg == graph_svg.workflow_svg(yaml.safe_load(FLOW))


def _event(session: Any, seq: int, kind: str, node: str, at: dt.datetime, **data: Any) -> None:
    event = Event.objects.create(session=session, seq=seq, type=kind, data={"node": node, **data})
    Event.objects.filter(pk=event.pk).update(created_at=at)


def test_a_runs_marks_are_drawn_onto_the_kept_picture() -> None:
    _apply()
    owner: Any = UserFactory(username="runner")
    session, _ = workflow_run_start(owner=owner, key_roles=["support"], slug="two-steps", input={})
    Event.objects.filter(session=session, type__startswith="node.").delete()
    t0 = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)
    base = 1000
    _event(session, base + 1, "node.started", "first", t0, visit=1)
    _event(session, base + 2, "node.finished", "first", t0 + dt.timedelta(seconds=2.5))
    for visit in (1, 2):
        start = t0 + dt.timedelta(seconds=10 * visit)
        _event(session, base + 2 + 2 * visit, "node.started", "check", start, visit=visit)
        _event(session, base + 3 + 2 * visit, "node.finished", "check", start)
    _event(session, base + 9, "node.started", "second", t0 + dt.timedelta(seconds=40), visit=1)
    _event(session, base + 10, "node.failed", "second", t0 + dt.timedelta(seconds=41))
    session.workflow_state = {**(session.workflow_state or {}), "active": []}
    session.save(update_fields=["workflow_state"])

    root = ET.fromstring(run_graph_svg(session, link=lambda n: f"#node-{n}"))

    assert "wf-run" in (root.get("class") or "")
    nodes = {g.get("data-node"): g for g in root.iter(f"{SVG}g") if g.get("data-node")}
    assert "wf-visited" in (nodes["first"].get("class") or "")
    assert "wf-failed" in (nodes["second"].get("class") or "")
    badges = [
        "".join(b.itertext())
        for b in nodes["check"].iter(f"{SVG}g")
        if b.get("class") == "wf-badge"
    ]
    assert badges == ["×2"]
    assert "run: visited, 1 visit(s), the last took 2.5 s" in (
        nodes["first"].findtext(f"{SVG}title") or ""
    )
    assert [a.get("href") for a in root.iter(f"{SVG}a")] == [
        "#node-first",
        "#node-check",
        "#node-second",
    ]
