"""The operator's pages in a real browser (Chromium) against the live stack.

Set ADMIN_SHOTS_DIR to keep 1400 px wide screenshots of every page visited.
"""

import importlib.util
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model

from record.models import Agent, ModelEndpoint, Session
from runtime.breaker import model_breaker
from tests.demo_setup import DEMO_REQUEST, demo_install
from tests.e2e.support import api, create_session, post_message, wait_events
from tests.factories import api_key_for

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
HAVE_BROWSER = importlib.util.find_spec("playwright") is not None and bool(shutil.which(CHROMIUM))
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
OPERATOR_PASSWORD = "operator-pw-for-tests"
WIDTH = 1400

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        not HAVE_BROWSER,
        reason=f"needs the playwright package and Chromium at {CHROMIUM} "
        "(apt-get install chromium; `playwright install` is not used)",
    ),
]


def _shot(page: Any, name: str) -> None:
    folder = os.environ.get("ADMIN_SHOTS_DIR")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(folder) / f"{name}.png"), full_page=True)
        page.screenshot(path=str(Path(folder) / f"{name}-screen.png"))


@contextmanager
def chromium() -> Iterator[Any]:
    """Playwright's sync API runs an event loop in this thread, so Django's ORM
    refuses to work inside this block: set data up before, check it after."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


def _busy_data(live_stack: Any) -> dict[str, Any]:
    """What an operator sees on a normal day: finished turns with tool calls, and a failure."""
    demo_install()
    key = api_key_for("demo")
    with api(live_stack, key) as client:
        finished = []
        for content in (DEMO_REQUEST, "hello", DEMO_REQUEST):
            session_id = create_session(client, "order-support")
            post_message(client, session_id, content)
            finished.append(session_id)
        # A model nobody answers: the turn ends in error and the breaker opens.
        dead = ModelEndpoint.objects.create(
            name="unreachable", api="openai", base_url="http://127.0.0.1:9/v1", model="m"
        )
        Agent.objects.create(
            slug="broken", name="Broken model", model=dead, rules=[], tools=["query_orders"]
        )
        failed = create_session(client, "broken")
        post_message(client, failed, "anyone there?")
        for session_id in [*finished, failed]:
            wait_events(
                client,
                session_id,
                lambda events: any(e["type"] == "turn.finished" for e in events),
                timeout=60,
                describe=lambda: live_stack.log_tail("worker"),
            )
    # Repeated failures (as on a real outage) open its circuit breaker.
    breaker = model_breaker()
    for _ in range(breaker.threshold):
        breaker.record_failure(dead.name)
    get_user_model().objects.create_superuser("operator", "op@example.com", OPERATOR_PASSWORD)
    # A remembered preference with its history (long text: the list must still fit),
    # written the way the `remember` tool writes it: the second value updates the item.
    from memory.models import MemoryOwnerIndex
    from memory.services import memory_remember

    owner = get_user_model().objects.create_user("memory-owner")
    for content in (
        "I prefer to be contacted by phone in the morning, never after 6 pm " * 3,
        "I prefer email for everything about orders and invoices, with a copy to my assistant " * 3,
    ):
        new = memory_remember(
            owner_id=owner.pk, content=content, tag="preference", subject="contact channel"
        ).item
    # A large owner's own search index: one built, one whose build failed.
    MemoryOwnerIndex.objects.create(
        owner=owner, dims=256, name="memory_owner_hnsw_256_o1", state="ready",
        items_at_build=50_000, build_s=12.4, built_at=new.created_at,
    )  # fmt: skip
    MemoryOwnerIndex.objects.create(
        owner=get_user_model().objects.create_user("memory-tenant"), dims=1536,
        name="memory_owner_hnsw_1536_o2", state="failed", error="out of memory",
    )  # fmt: skip
    return {"key": key, "finished": finished, "failed": failed}


def _login(page: Any, live_stack: Any) -> None:
    page.goto(f"{live_stack.http}/admin/login/")
    page.fill("#id_username", "operator")
    page.fill("#id_password", OPERATOR_PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(f"{live_stack.http}/admin/")


def test_operator_pages_read_well_and_a_session_is_a_read_only_record(live_stack):
    data = _busy_data(live_stack)
    with chromium() as browser:
        _operator_pages(browser, live_stack, data)


def _operator_pages(browser: Any, live_stack: Any, data: dict[str, Any]) -> None:
    page = browser.new_page(viewport={"width": WIDTH, "height": 900})
    _login(page, live_stack)

    session_id = data["finished"][0]
    page.goto(f"{live_stack.http}/admin/agent_sessions/session/{session_id}/change/")
    summary = page.locator("#ap-summary")
    assert summary.is_visible()
    text = summary.inner_text()
    for label in ("STATE", "TURN", "LAST TURN", "COST", "USAGE (TOKENS)", "TOOL CALLS"):
        assert label in text.upper(), label
    assert "finished" in page.locator("#ap-summary-state").inner_text()
    assert "answer" in text
    # Summary first, then the timeline; no Save, no Delete, no editable metadata.
    summary_box, timeline_box = summary.bounding_box(), page.locator("#ap-timeline").bounding_box()
    assert summary_box["y"] < timeline_box["y"]
    assert page.locator("input[name=_save], input[name=_continue], a.deletelink").count() == 0
    assert page.locator("textarea[name=metadata]").count() == 0
    _shot(page, "session-change")

    page.goto(f"{live_stack.http}/admin/agent_sessions/session/{data['failed']}/change/")
    failed_summary = page.locator("#ap-summary").inner_text().upper()
    assert "LAST ERROR" in failed_summary and "MODEL UNAVAILABLE" in failed_summary
    _shot(page, "session-change-error")

    pages = {
        "session-list": "/admin/agent_sessions/session/",
        "modelendpoint-list": "/admin/agent_sessions/modelendpoint/",
        "tool-list": "/admin/tools/tool/",
        "modelcall-list": "/admin/agent_sessions/modelcall/",
        "memoryitem-list": "/admin/memory/memoryitem/",
        "memoryownerindex-list": "/admin/memory/memoryownerindex/",
    }
    for name, path in pages.items():
        page.goto(live_stack.http + path)
        # Fits the screen: no column of the result table is cut off or scrolled to.
        overflow = page.evaluate(
            "(() => { const box = document.querySelector('#changelist .results');"
            " return [box.scrollWidth, box.clientWidth]; })()"
        )
        assert overflow[0] <= overflow[1], (name, overflow)
        _shot(page, name)
    # Workers and their health: the live stack's worker is listed, the table fits.
    page.goto(f"{live_stack.http}/admin/agent_sessions/workerhealth/")
    assert "taking runs" in page.locator("#workers").inner_text()
    width = page.evaluate(
        "(() => [document.querySelector('#workers').scrollWidth,"
        " document.documentElement.clientWidth])()"
    )
    assert width[0] <= width[1] <= WIDTH, width
    _shot(page, "workers")
    page.goto(f"{live_stack.http}{pages['modelendpoint-list']}")
    assert "open until" in page.locator("#result_list").inner_text()
    page.goto(f"{live_stack.http}{pages['session-list']}")
    listed = page.locator("#result_list").inner_text()
    # Each last turn's outcome, and why one was not ok.
    assert "ok" in listed and "error" in listed and "model unavailable" in listed


def test_playground_lists_agents_only_with_a_key_and_follows_the_state(live_stack):
    demo_install()
    key = api_key_for("demo")
    with chromium() as browser:
        statuses, urls = _playground_turn(browser, live_stack, key)
    assert "Working: the model is thinking…" in statuses
    assert "Working: running a tool…" in statuses
    # The key travelled in headers and a subprotocol only, never in a URL.
    assert urls and not [u for u in urls if key in u]
    session = Session.objects.get(owner__username="demo")
    assert session.state == "finished" and session.turn == 1


def _playground_turn(browser: Any, live_stack: Any, key: str) -> tuple[list[str], list[str]]:
    page = browser.new_page(viewport={"width": WIDTH, "height": 900})
    urls: list[str] = []
    page.on("request", lambda request: urls.append(request.url))
    page.on("websocket", lambda ws: urls.append(ws.url))
    page.goto(f"{live_stack.http}/playground/")
    # No key, no agents.
    assert page.locator("#agent option").all_inner_texts() == ["paste an API key to see the agents"]
    assert page.locator("#new-session").is_disabled()

    page.fill("#key", key)
    page.locator("#key").dispatch_event("change")
    page.wait_for_selector("#agent option[value=order-support]", state="attached")
    # Record every status line the page shows while a turn runs.
    page.evaluate(
        """() => {
          window.statuses = [];
          const status = document.getElementById("status");
          new MutationObserver(() => window.statuses.push(status.textContent))
            .observe(status, {childList: true, characterData: true, subtree: true});
        }"""
    )
    page.click("#new-session")
    page.wait_for_selector("#conn.live")
    page.fill("#content", DEMO_REQUEST)
    page.click("#send")
    page.wait_for_function(
        "document.getElementById('state').textContent === 'finished'", timeout=60_000
    )
    deadline = time.monotonic() + 10
    while "Turn 1 finished" not in page.locator("#status").inner_text():
        assert time.monotonic() < deadline, page.locator("#status").inner_text()
        time.sleep(0.1)
    assert page.locator("#status").get_attribute("data-state") == "finished"
    _shot(page, "playground")
    return list(page.evaluate("window.statuses")), urls
