"""A workflow run's page in the admin, in a real browser (Chromium) on the live stack: the
graph with the nodes the run visited, the one it waits at and the one that failed, and the
node table with what went in and what came out.

Screenshots go to WF_SHOTS_DIR (default /tmp/wf-e2e), 1400 px wide.
"""

import os
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model

from tests.e2e.support import api, stack_logs, turns_finished, wait_events
from tests.e2e.test_admin_pages import CHROMIUM, HAVE_BROWSER, WIDTH, chromium
from tests.e2e.test_workflows_e2e import RoutedApi, _apply, _http_tool, _start, _wait_state
from tests.factories import api_key_for
from tests.stack import Stack
from tests.tools.http_server import Answer, Seen

PASSWORD = "operator-pw-for-tests"
SHOTS = Path(os.environ.get("WF_SHOTS_DIR") or "/tmp/wf-e2e")

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        not HAVE_BROWSER,
        reason=f"needs the playwright package and Chromium at {CHROMIUM} "
        "(apt-get install chromium; `playwright install` is not used)",
    ),
]

DELAYED_ORDER = """
slug: delayed-order
name: Tell the customers of a delayed order
role: support
input:
  type: object
  properties:
    order: {type: string}
    customers: {type: array, items: {type: integer}}
  required: [order, customers]
start: lookup
result: answer
nodes:
  lookup: {kind: tool, tool: order_status, args: {number: input.order}, output: order, next: check}
  check:
    kind: condition
    cases: [{when: "order.delayed", next: notify}]
    default: tell
  notify:
    kind: map
    over: input.customers
    as: c
    concurrency: 2
    node: {kind: tool, tool: notify_customer, args: {customer: c, order: input.order}}
    output: notified
    next: review
  review:
    kind: human
    summary: "Offer a coupon on {{ input.order }}: {{ size(notified) }} customers were told"
    timeout_s: 600
    on_timeout: reject
    output: decision
    next: tell
    rejected: tell
  tell: {kind: llm, prompt: "Say: order {{ input.order }} handled", output: answer, next: end}
rules:
  - {when: {user: "^Say: (.*)$"}, answer: "{{ match.1 }}"}
"""


def _business(seen: Seen) -> Answer:
    body = seen.body or {}
    if seen.path == "/orders":
        return Answer(200, {"number": body["number"], "delayed": body["number"] != "SO-2"})
    if body.get("customer") == 0:
        return Answer(422, {"ok": False, "error": "customer 0 has no address on file"})
    return Answer(200, {"ok": True, "customer": body["customer"], "channel": "email"})


def _shot(page: Any, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def _node_classes(page: Any) -> dict[str, str]:
    return dict(
        page.evaluate(
            "[...document.querySelectorAll('#ap-workflow svg g.wf-node')]"
            ".map(g => [g.dataset.node, g.getAttribute('class')])"
        )
    )


def _rows(page: Any) -> dict[str, dict[str, str]]:
    """The node table: per node, its cells' text (details opened, so inputs and outputs show)."""
    page.evaluate("document.querySelectorAll('#ap-workflow details').forEach(d => d.open = true)")
    rows = page.evaluate(
        "[...document.querySelectorAll('#ap-workflow tr.wf-row')].map(tr => "
        "[...tr.querySelectorAll('td')].map(td => td.innerText.trim()))"
    )
    names = [
        "node",
        "kind",
        "visits",
        "duration",
        "cost",
        "status",
        "input",
        "output",
        "checkpoint",
    ]
    return {cells[0].split("\n")[0]: dict(zip(names, cells, strict=True)) for cells in rows}


def test_a_runs_page_draws_its_graph_and_lists_each_nodes_input_and_output(
    live_stack: Stack,
) -> None:
    get_user_model().objects.create_superuser("operator", "op@example.com", PASSWORD)
    with RoutedApi(_business) as business:
        _http_tool("order_status", business.url("/orders"), {"number": {"type": "string"}})
        _http_tool(
            "notify_customer",
            business.url("/notify"),
            {"customer": {"type": "integer"}, "order": {"type": "string"}},
            side_effects=True,
        )
        _apply(DELAYED_ORDER)
        with api(live_stack, api_key_for("alice")) as client:
            waiting = _start(client, "delayed-order", {"order": "SO-1", "customers": [7, 8, 9]})
            failed = _start(client, "delayed-order", {"order": "SO-3", "customers": [7, 0]})
            done = _start(client, "delayed-order", {"order": "SO-2", "customers": [7]})
            _wait_state(client, waiting, "awaiting_approval", 20, stack_logs(live_stack))
            for run in (failed, done):
                wait_events(client, run, turns_finished(1), 20, stack_logs(live_stack))

    with chromium() as browser:
        page = browser.new_page(viewport={"width": WIDTH, "height": 900})
        page.goto(f"{live_stack.http}/admin/login/")
        page.fill("#id_username", "operator")
        page.fill("#id_password", PASSWORD)
        page.click("input[type=submit]")
        page.wait_for_url(f"{live_stack.http}/admin/")
        seen: dict[str, tuple[dict[str, str], dict[str, dict[str, str]], str, list[int]]] = {}
        figures: dict[str, tuple[float, list[str]]] = {}
        for name, run in (("waiting", waiting), ("failed", failed), ("finished", done)):
            page.goto(f"{live_stack.http}/admin/agent_sessions/session/{run}/change/")
            section = page.locator("#ap-workflow")
            section.scroll_into_view_if_needed()
            overflow = page.evaluate("[document.body.scrollWidth, window.innerWidth]")
            seen[name] = (_node_classes(page), _rows(page), section.inner_text(), overflow)
            # The graph at the page's full width, each node's figures drawn under it.
            graph = page.locator("#ap-workflow .ap-wf-graph svg").bounding_box()
            figures[name] = (
                graph["width"] if graph else 0,
                page.locator("#ap-workflow svg text.wf-figures").evaluate_all(
                    "els => els.map(e => e.textContent)"
                ),
            )
            _shot(page, f"run-{name}")
            section.screenshot(path=str(SHOTS / f"run-{name}-graph.png"))
        # The failed run: a node clicked on the graph shows what went in and came out beside
        # it, with no reload; one from the table replaces it; a node group of the timeline folds.
        page.goto(f"{live_stack.http}/admin/agent_sessions/session/{failed}/change/")
        page.evaluate("window.notReloaded = true")
        assert page.locator("#ap-wf-panel").is_hidden()
        page.click('#ap-workflow svg g.wf-node[data-node="lookup"]')
        panel = page.locator("#ap-wf-panel")
        panel.wait_for(state="visible")
        beside = (page.locator("#ap-workflow .ap-wf-graph").bounding_box(), panel.bounding_box())
        picked = panel.inner_text()
        _shot(page, "run-failed-node-panel")
        page.locator("#ap-workflow").screenshot(path=str(SHOTS / "run-failed-node-panel-graph.png"))
        page.click('#ap-workflow tr.wf-row[data-node="notify"] td:nth-child(3)')
        picked_from_table = panel.inner_text()
        group = page.locator('#ap-timeline details.ap-tl-group[data-node="lookup"]')
        rows_before = group.locator("tr").count()
        group.locator("> summary").click()
        folded = (group.evaluate("d => d.open"), group.locator("table").is_visible())
        summaries = page.locator("#ap-timeline details.ap-tl-group > summary").all_inner_texts()
        kept = page.evaluate("window.notReloaded === true")
        page.locator("#ap-timeline").screenshot(path=str(SHOTS / "run-failed-timeline.png"))

    def has(classes: str, *wanted: str) -> bool:
        return set(wanted) <= set(classes.split())

    # Waiting for a person: three nodes visited, the review active, the last one not reached.
    classes, rows, text, overflow = seen["waiting"]
    assert overflow[0] <= overflow[1], overflow  # nothing wider than the window
    assert "Workflow delayed-order · version 1" in text and "active now: review" in text
    for node in ("lookup", "check", "notify"):
        assert has(classes[node], "wf-node", "wf-visited"), (node, classes)
    assert has(classes["review"], "wf-human", "wf-active"), classes
    assert not has(classes["tell"], "wf-visited") and not has(classes["tell"], "wf-active")
    assert list(rows) == ["lookup", "check", "notify", "review"]
    assert '"number": "SO-1"' in rows["lookup"]["input"]
    assert '"delayed": true' in rows["lookup"]["output"]
    assert rows["check"]["node"].endswith("→ notify")
    assert rows["check"]["output"] == ""  # a condition writes nothing
    # A map's row shows each item's arguments, one line each, and its results in order.
    assert rows["notify"]["input"].splitlines()[-3:] == [
        f'item {i}: {{"customer": {c}, "order": "SO-1"}}' for i, c in enumerate((7, 8, 9))
    ], rows["notify"]
    output = rows["notify"]["output"]
    assert (
        output.index('"customer": 7')
        < output.index('"customer": 8')
        < output.index('"customer": 9')
    )
    assert "Offer a coupon on SO-1: 3 customers were told" in rows["review"]["input"]
    assert rows["review"]["status"] == "waiting for approval"  # a person, not a run
    width, drawn = figures["waiting"]
    assert width > 1200, width  # not a ~450 px column
    assert len(drawn) == len(rows) and all("×" in d for d in drawn), drawn
    assert rows["lookup"]["duration"].endswith(("ms", " s")), rows["lookup"]

    # Failed in the map: its row says why, the graph marks it.
    classes, rows, text, overflow = seen["failed"]
    assert overflow[0] <= overflow[1], overflow
    assert has(classes["notify"], "wf-map", "wf-failed"), classes
    assert has(classes["lookup"], "wf-visited") and has(classes["check"], "wf-visited")
    assert "failed at notify: item 1" in text and "active now" not in text
    assert rows["notify"]["status"] == "failed"
    assert "customer 0 has no address on file" in rows["notify"]["output"]

    # The panel beside the graph (not under it), the node's own figures and output, as text.
    graph_box, panel_box = beside
    assert graph_box and panel_box and panel_box["x"] >= graph_box["x"] + graph_box["width"]
    assert panel_box["y"] < graph_box["y"] + graph_box["height"], beside
    assert picked.split("\n")[:2] == ["lookup", "ok"] and "Visits\n1\n" in picked, picked
    assert '"number": "SO-3"' in picked and '"delayed": true' in picked, picked
    assert picked_from_table.split("\n")[:2] == ["notify", "failed"], picked_from_table
    assert "customer 0 has no address on file" in picked_from_table and kept
    # The timeline by node, in the path's order, each with its status word; lookup folded.
    assert rows_before > 1 and folded == (False, False), (rows_before, folded)
    nodes = [s.split(" ")[0] for s in summaries if not s.startswith("the run")]
    assert nodes == ["lookup", "check", "notify"], summaries
    assert summaries[[s.split(" ")[0] for s in summaries].index("notify")].startswith(
        "notify · failed"
    ), summaries

    # Finished by the short path: the map and the review never ran.
    classes, rows, text, overflow = seen["finished"]
    assert overflow[0] <= overflow[1], overflow
    assert {n for n, c in classes.items() if has(c, "wf-visited")} == {"lookup", "check", "tell"}
    assert "order SO-2 handled" in text  # the result
    assert list(rows) == ["lookup", "check", "tell"]
    assert "Say: order SO-2 handled" not in rows["tell"]["input"]  # an llm node makes no call


AUTHORED = """models:
  - name: rules
    api: rules
workflows:
  - slug: authored-e2e
    name: Authored
    role: support
    start: zeta
    nodes:
      # The author's first node: not alphabetical.
      zeta: {kind: wait, seconds: 1, next: alpha}
      alpha:
        kind: condition   # the branch is the point
        cases: [{when: "true", next: end}]
        default: end
"""


def test_the_yaml_editor_keeps_order_and_comments_through_an_edit_in_the_browser(
    live_stack: Stack, tmp_path: Path
) -> None:
    from django.core.management import call_command

    from workflows.models import Workflow, WorkflowVersion

    path = tmp_path / "authored.yaml"
    path.write_text(AUTHORED)
    call_command("apply_config", str(path), "--no-url-check")
    workflow = Workflow.objects.get(slug="authored-e2e")
    get_user_model().objects.create_superuser("yaml-operator", "op@example.com", PASSWORD)
    url = f"{live_stack.http}/admin/workflows/workflow/{workflow.pk}/change/"
    with chromium() as browser:
        page = browser.new_page(viewport={"width": WIDTH, "height": 900})
        page.goto(f"{live_stack.http}/admin/login/")
        page.fill("#id_username", "yaml-operator")
        page.fill("#id_password", PASSWORD)
        page.click("input[type=submit]")
        page.wait_for_url(f"{live_stack.http}/admin/")
        page.goto(url)
        shown = page.input_value("#id_definition_yaml")
        page.fill("#id_definition_yaml", shown.replace("name: Authored", "name: Authored, edited"))
        page.click("input[name=_continue]")
        page.wait_for_selector("text=was changed successfully")
        kept = page.input_value("#id_definition_yaml")
        page.locator("#id_definition_yaml").scroll_into_view_if_needed()
        page.screenshot(path=str(SHOTS / "workflow-yaml-editor.png"))
    assert "# The author's first node: not alphabetical." in shown
    assert shown.index("zeta:") < shown.index("alpha:")
    assert "name: Authored, edited" in kept and "# the branch is the point" in kept
    assert kept.index("zeta:") < kept.index("alpha:")
    assert WorkflowVersion.objects.filter(workflow=workflow).count() == 2
