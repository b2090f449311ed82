"""Workflows in the admin: drawn, edited as YAML with apply_config's validation inline, each save
a new version; a run's page draws its graph with what the run did."""

import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from django.core.management import call_command
from django.test import Client

from engine import session_run
from tests.event_order import assert_events_in_order
from tests.factories import ModelEndpointFactory, StaffUserFactory, ToolFactory, UserFactory
from workflows.models import Workflow, WorkflowVersion
from workflows.selectors import definition_check
from workflows.services import workflow_apply, workflow_run_start

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _events_in_order() -> Iterator[None]:
    """Every run's events, at the test's end, in the order a watcher can render
    (tests/event_order.py)."""
    yield
    assert_events_in_order()


FLOW = """slug: look
name: Look up
role: support
start: first
nodes:
  first: {kind: tool, tool: clock, args: {}, output: now, next: second}
  second:
    kind: condition
    cases: [{when: "now.now != ''", next: end}]
    default: end
"""


@pytest.fixture
def admin_client() -> Client:
    ModelEndpointFactory()
    ToolFactory(name="clock", roles=["support"])
    user = UserFactory(username="root", is_staff=True, is_superuser=True)
    client = Client()
    client.force_login(user)
    return client


def _apply(text: str = FLOW) -> Workflow:
    raw = yaml.safe_load(text)
    workflow_apply(definition=definition_check(raw, where="t"), where="t", default_model="rules")
    return Workflow.objects.get(slug=raw["slug"])


def test_the_change_page_draws_the_graph_and_shows_the_yaml(admin_client: Client) -> None:
    workflow = _apply()
    page = admin_client.get(f"/admin/workflows/workflow/{workflow.pk}/change/")

    assert page.status_code == 200
    body = page.content.decode()
    assert body.count('class="wf-node wf-') == 2 and 'data-node="second"' in body
    assert "kind: condition" in body  # the current version as YAML


def test_an_edit_with_errors_is_refused_inline_naming_node_and_field(admin_client: Client) -> None:
    workflow = _apply()
    broken = FLOW.replace("tool: clock", "tool: clonk").replace("now.now != ''", "now.now !=")
    page = admin_client.post(
        f"/admin/workflows/workflow/{workflow.pk}/change/",
        {"definition_yaml": broken, "enabled": "on"},
    )

    assert page.status_code == 200  # the form again, with the errors
    body = page.content.decode()
    assert "workflow look.nodes.first.tool: unknown tool &#x27;clonk&#x27;" in body
    assert "workflow look.nodes.second.cases[0].when: CEL syntax error" in body
    assert WorkflowVersion.objects.filter(workflow=workflow).count() == 1


def test_a_valid_edit_stores_a_new_version(admin_client: Client) -> None:
    workflow = _apply()
    edited = FLOW.replace("name: Look up", "name: Look it up")
    page = admin_client.post(
        f"/admin/workflows/workflow/{workflow.pk}/change/",
        {"definition_yaml": edited, "enabled": "on"},
    )

    assert page.status_code == 302, page.content.decode()[:2000]
    workflow.refresh_from_db()
    assert (workflow.current_version, workflow.name) == (2, "Look it up")
    version = WorkflowVersion.objects.get(workflow=workflow, number=2)
    assert version.source == "admin" and version.created_by.username == "root"


def test_a_new_workflow_can_be_added_as_yaml(admin_client: Client) -> None:
    page = admin_client.post(
        "/admin/workflows/workflow/add/",
        {"definition_yaml": FLOW.replace("slug: look", "slug: other")},
    )

    assert page.status_code == 302, page.content.decode()[:2000]
    assert Workflow.objects.get(slug="other").current_version == 1


def test_the_slug_of_an_existing_workflow_cannot_change(admin_client: Client) -> None:
    workflow = _apply()
    page = admin_client.post(
        f"/admin/workflows/workflow/{workflow.pk}/change/",
        {"definition_yaml": FLOW.replace("slug: look", "slug: renamed"), "enabled": "on"},
    )
    assert page.status_code == 200 and "a new slug is a new workflow" in page.content.decode()
    assert not Workflow.objects.filter(slug="renamed").exists()


def test_a_view_only_user_sees_the_graph_but_cannot_edit(admin_client: Client) -> None:
    workflow = _apply()
    viewer = StaffUserFactory(username="viewer", perms=["workflows.view_workflow"])
    client = Client()
    client.force_login(viewer)

    page = client.get(f"/admin/workflows/workflow/{workflow.pk}/change/")
    assert page.status_code == 200 and 'class="wf-node' in page.content.decode()
    posted = client.post(
        f"/admin/workflows/workflow/{workflow.pk}/change/",
        {"definition_yaml": FLOW.replace("Look up", "x"), "enabled": "on"},
    )
    assert posted.status_code == 403
    assert WorkflowVersion.objects.filter(workflow=workflow).count() == 1


def test_a_runs_page_draws_the_graph_with_what_the_run_did(admin_client: Client) -> None:
    _apply()
    owner: Any = UserFactory(username="runner")
    session, _ = workflow_run_start(owner=owner, key_roles=["support"], slug="look", input={})
    session_run(session_id=session.pk)

    page = admin_client.get(f"/admin/agent_sessions/session/{session.pk}/change/")

    body = page.content.decode()
    assert page.status_code == 200
    assert "Workflow look · version 1" in body
    assert body.count("wf-visited") >= 2  # both nodes, in the graph
    assert 'id="node-first"' in body and "arguments" not in body.split('id="node-second"')[1][:400]
    # Each node's visits, duration and cost: in its row, and for the graph to draw on it.
    rows = {r.node: r for r in page.context["workflow_run"].rows}
    assert rows["first"].visits == 1 and rows["first"].duration.endswith(("ms", " s"))
    assert 'data-node="first" data-figures="1× · ' in body


def test_a_nodes_fork_here_button_shows_the_preview_before_it_forks(admin_client: Client) -> None:
    from record.models import Checkpoint, Session

    _apply()
    owner: Any = UserFactory(username="runner")
    session, _ = workflow_run_start(owner=owner, key_roles=["support"], slug="look", input={})
    session_run(session_id=session.pk)
    page = admin_client.get(f"/admin/agent_sessions/session/{session.pk}/change/").content.decode()
    row = page.split('id="node-first"')[1].split("</tr>")[0]
    step = row.split('value="fork@')[1].split('"')[0]
    assert "Fork here…" in row and "confirm(" not in row  # no bare browser dialog any more
    assert Checkpoint.objects.filter(session=session, step=int(step)).exists()

    url = f"/admin/agent_sessions/session/{session.pk}/operate/"
    preview = admin_client.post(url, {"action": f"fork@{step}"})
    assert preview.status_code == 200 and "fork-preview" in preview.content.decode()
    assert f'name="action" value="fork@{step}"' in preview.content.decode()
    assert not Session.objects.filter(forked_from=session).exists()
    admin_client.post(url, {"action": f"fork@{step}", "confirm": "yes"})
    assert Session.objects.get(forked_from=session).forked_at_step == int(step)


def _alias_bomb(levels: int) -> str:
    """`levels` lines; each alias line makes ten of the line before (9 lines: 1.1 GB loaded)."""
    lines = [
        "slug: look",
        'l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]',
    ]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def test_an_alias_bomb_is_refused_at_once_with_a_form_error(admin_client: Client) -> None:
    workflow = _apply()
    admin_client.get(f"/admin/workflows/workflow/{workflow.pk}/change/")  # warm
    page = admin_client.post(
        f"/admin/workflows/workflow/{workflow.pk}/change/",
        {"definition_yaml": _alias_bomb(7), "enabled": "on"},
    )

    assert page.status_code == 200
    assert "the document comes to more than 100,000 values once its aliases" in (
        page.content.decode()
    )
    assert WorkflowVersion.objects.filter(workflow=workflow).count() == 1


def test_a_definition_over_the_size_limit_is_refused_with_a_form_error(
    admin_client: Client, settings: Any
) -> None:
    settings.DEFINITION_MAX_BYTES = 100
    page = admin_client.post("/admin/workflows/workflow/add/", {"definition_yaml": FLOW})

    assert page.status_code == 200
    assert f"the document is {len(FLOW.strip())} bytes; at most 100 (DEFINITION_MAX_BYTES)" in (
        page.content.decode()
    )
    assert not Workflow.objects.exists()


def test_the_list_shows_runs_failures_and_the_median_duration(admin_client: Client) -> None:
    from datetime import timedelta

    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from record.models import Session

    flow = _apply()
    _apply(FLOW.replace("slug: look", "slug: idle-flow"))
    owner: Any = UserFactory(username="runner")
    runs = [
        workflow_run_start(owner=owner, key_roles=["support"], slug="look", input={})[0]
        for _ in range(3)
    ]
    for run, (seconds, outcome) in zip(runs, [(10, "ok"), (20, "error"), (60, "ok")], strict=True):
        Session.objects.filter(pk=run.pk).update(
            state="finished" if outcome == "ok" else "error",
            last_turn_outcome=outcome,
            created_at=run.created_at,
            updated_at=run.created_at + timedelta(seconds=seconds),
        )

    with CaptureQueriesContext(connection) as queries:
        body = admin_client.get("/admin/workflows/workflow/").content.decode()

    row = body.split('href="/admin/workflows/workflow/' + str(flow.pk))[1][:1500]
    assert ">3</a>" in row and ">1</a>" in row and "20.0 s" in row
    assert f"agent__id__exact={flow.runtime_agent_id}&amp;last_turn=error" in row
    # The other workflow: no runs, no median.
    assert "-" in body.split("idle-flow")[1][:1500]
    # The figures ride in the list's own query, not one query per workflow.
    assert sum("percentile_cont" in q["sql"] for q in queries.captured_queries) == 1


AUTHORED = """# A config file as its author keeps it.
models:
  - name: rules
    api: rules
workflows:
  # Looks the time up, then decides.
  - slug: authored
    name: Authored
    role: support
    start: zeta
    nodes:
      # The first node as the author ordered them (not alphabetically).
      zeta: {kind: tool, tool: clock, args: {}, output: now, next: alpha}
      alpha:
        kind: condition   # why: the branch is the point
        cases: [{when: "now.now != ''", next: end}]
        default: end
  # A second entry: its heading comment is not the first's.
  - slug: second
    name: Second
    role: support
    start: only
    nodes:
      only: {kind: tool, tool: clock, args: {}, output: now, next: end}
"""


def test_the_editor_keeps_the_authors_order_and_comments_through_an_edit(
    admin_client: Client, tmp_path: Any
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(AUTHORED)
    call_command("apply_config", str(path), "--no-url-check")
    workflow = Workflow.objects.get(slug="authored")
    page = admin_client.get(f"/admin/workflows/workflow/{workflow.pk}/change/")
    shown = page.context["adminform"].form.fields["definition_yaml"].initial
    assert shown.startswith("slug: authored\n") and "A second entry" not in shown
    assert "# The first node as the author ordered them" in shown
    assert "# why: the branch is the point" in shown
    assert shown.index("zeta:") < shown.index("alpha:")

    # One field edited in the editor: the rest stays as written.
    edited = shown.replace("name: Authored", "name: Authored, edited")
    page = admin_client.post(
        f"/admin/workflows/workflow/{workflow.pk}/change/",
        {"definition_yaml": edited, "enabled": "on"},
    )
    assert page.status_code == 302, page.content.decode()[:2000]
    body = admin_client.get(f"/admin/workflows/workflow/{workflow.pk}/change/").content.decode()
    assert "name: Authored, edited" in body
    assert "# why: the branch is the point" in body
    assert body.index("zeta: {kind: tool") < body.index("alpha:\n")
    assert WorkflowVersion.objects.get(workflow=workflow, number=2).text == edited.rstrip()
    # The stored meaning is the same as before but for the edit.
    first, second = (
        WorkflowVersion.objects.get(workflow=workflow, number=n).definition for n in (1, 2)
    )
    assert {**first, "name": "Authored, edited"} == second


HOSTILE = """slug: hostile
name: Says what it is told
role: support
input: {type: object, properties: {text: {type: string}}, required: [text]}
start: first
result: answer
nodes:
  first: {kind: tool, tool: clock, args: {}, output: now, next: tell}
  tell: {kind: llm, prompt: "Say: {{ input.text }}", output: answer, next: end}
rules:
  - {when: {user: "^Say: (.*)$"}, answer: "{{ match.1 }}"}
"""
SCRIPT = '</script><script>alert(1)</script><img src=x onerror="alert(2)">'


def test_a_runs_page_embeds_each_nodes_inputs_and_outputs_as_json_never_as_markup(
    admin_client: Client,
) -> None:
    _apply(HOSTILE)
    owner: Any = UserFactory(username="runner")
    session, _ = workflow_run_start(
        owner=owner, key_roles=["support"], slug="hostile", input={"text": SCRIPT}
    )
    session_run(session_id=session.pk)

    page = admin_client.get(f"/admin/agent_sessions/session/{session.pk}/change/")

    body = page.content.decode()
    assert page.status_code == 200
    assert "<script>alert(1)" not in body and "<img src=x" not in body
    # The panel's data: the node's output as it was said, read back by the page's script.
    data = body.split('id="ap-wf-panel-data" type="application/json">')[1].split("</script>")[0]
    panel = json.loads(data)
    assert SCRIPT in panel["tell"]["output"] and panel["tell"]["status"] == "ok"
    assert panel["first"]["kind"] == "tool" and panel["first"]["visits"] == 1
    # The timeline node by node, in the path's order, each group collapsible.
    groups = page.context["timeline_groups"]
    assert [g.node for g in groups if g.node] == ["first", "tell"]
    assert body.count('<details class="ap-tl-group') == len(groups)
    assert '<details class="ap-tl-group ap-tl-ok" open data-node="tell">' in body
