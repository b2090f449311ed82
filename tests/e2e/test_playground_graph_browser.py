"""The playground's workflow graph in Chromium at 1400 px: the pane takes its graph's height
and the whole graph shows (no node behind a scroll), and a tool card says its status in the
one vocabulary (sessions/status.py)."""

import json
from typing import Any

import pytest

from sessions.status import CALLS
from tests.demo_setup import demo_install
from tests.e2e.test_admin_pages import CHROMIUM, HAVE_BROWSER, WIDTH, _shot, chromium
from tests.factories import api_key_for

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not HAVE_BROWSER, reason=f"needs playwright and Chromium at {CHROMIUM}"),
]


def test_the_run_graph_pane_shows_the_whole_graph(live_stack: Any) -> None:
    demo_install()
    key = api_key_for("demo")
    with chromium() as browser:
        page = browser.new_page(viewport={"width": WIDTH, "height": 900})
        page.goto(f"{live_stack.http}/playground/")
        page.fill("#key", key)
        page.locator("#key").dispatch_event("change")
        page.wait_for_selector(
            "#workflow option[value=logistics-exceptions]", state="attached", timeout=30_000
        )
        page.select_option("#workflow", "logistics-exceptions")
        page.fill("#workflow-input", json.dumps({"days": 7}))
        page.click("#start-run")
        page.wait_for_function(
            "document.getElementById('state').textContent === 'finished'", timeout=90_000
        )
        page.wait_for_selector("#graph img", timeout=15_000)
        page.wait_for_function("document.querySelector('#graph img').complete")
        page.wait_for_timeout(500)  # the last refresh after turn.finished
        figures = page.evaluate(
            """() => {
              const pane = document.getElementById("graph"), img = pane.querySelector("img");
              const p = pane.getBoundingClientRect(), i = img.getBoundingClientRect();
              return {scroll: pane.scrollHeight, client: pane.clientHeight,
                      paneTop: p.top, paneBottom: p.bottom, imgTop: i.top, imgBottom: i.bottom,
                      imgHeight: i.height, natural: img.naturalHeight};
            }"""
        )
        states = page.locator("#transcript .tool .status").all_inner_texts()
        _shot(page, "playground-run-graph")
    # Nothing of the graph is hidden: the pane does not scroll, the image lies inside it.
    assert figures["scroll"] <= figures["client"] + 1, figures
    assert figures["imgTop"] >= figures["paneTop"] and figures["imgBottom"] <= figures["paneBottom"]
    assert figures["imgHeight"] > 200, figures  # drawn, not a sliver
    assert all(s.split(" · ")[0] in {c.label for c in CALLS.values()} for s in states), states
