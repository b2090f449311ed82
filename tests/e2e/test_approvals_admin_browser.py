"""The approvers' queue in a real browser (Chromium) on the live stack: approve in two clicks
and watch the session go on; bulk reject; the session page with approvals and takeover controls.

Set ADMIN_SHOTS_DIR to keep 1400 px wide screenshots of the pages.
"""

import uuid
from typing import Any

import pytest
from django.contrib.auth import get_user_model

from accounts.services import approver_grant
from approvals.models import Approval
from record.models import Session
from tests.e2e.support import api, create_session, post_message, turns_finished, wait_events
from tests.e2e.test_admin_pages import CHROMIUM, HAVE_BROWSER, WIDTH, _shot, chromium
from tests.factories import AgentFactory, ModelEndpointFactory, ToolFactory, api_key_for

PASSWORD = "approver-pw-for-tests"

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        not HAVE_BROWSER,
        reason=f"needs the playwright package and Chromium at {CHROMIUM} "
        "(apt-get install chromium; `playwright install` is not used)",
    ),
]


def _agent() -> str:
    ToolFactory(
        name="stamp_invoice",
        description="Stamp an invoice as paid.",
        handler="builtin.current_time",
        side_effects=True,
        requires_approval=True,
        parameters={"type": "object", "properties": {}},
    )
    slug = f"billing-{uuid.uuid4().hex[:6]}"
    AgentFactory(
        slug=slug,
        model=ModelEndpointFactory(name="rules", api="rules", options={}),
        tools=["stamp_invoice"],
        rules=[
            {"when": {"last_tool": "stamp_invoice", "result": '"status":"rejected"'},
             "answer": "Not stamped: {{ result.error }}"},
            {"when": {"last_tool": "stamp_invoice"}, "answer": "Stamped at {{ tools.stamp_invoice.now }}"},
            {"when": {"user": "stamp", "last_tool": None},
             "tool_calls": [{"tool": "stamp_invoice", "args": {}}]},
            {"answer": "?"},
        ],
    )  # fmt: skip
    return slug


def _login(page: Any, live_stack: Any, username: str) -> None:
    page.goto(f"{live_stack.http}/admin/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")


def test_approve_from_the_queue_in_two_clicks_and_the_session_goes_on(live_stack):
    slug = _agent()
    key = api_key_for("customer")
    get_user_model().objects.create_superuser("operator", "op@example.com", PASSWORD)
    get_user_model().objects.create_user("bob", password=PASSWORD, is_staff=True)
    approver_grant(username="bob")
    with api(live_stack, key) as client:
        sessions = [create_session(client, slug) for _ in range(3)]
        for number, session_id in enumerate(sessions, start=1):
            post_message(client, session_id, f"stamp invoice INV-{number:04d} please")
        for session_id in sessions:
            wait_events(
                client,
                session_id,
                lambda events: any(e["type"] == "approval.requested" for e in events),
                timeout=60,
                describe=lambda: live_stack.log_tail("worker"),
            )
    first = Approval.objects.get(session_id=sessions[0])

    with chromium() as browser:
        page = browser.new_page(viewport={"width": WIDTH, "height": 900})
        # An approver who is not an operator lands on the queue and sees nothing else.
        _login(page, live_stack, "bob")
        page.wait_for_url(f"{live_stack.http}/admin/approvals/approval/queue/")
        assert "3 pending" in page.locator("#q-count").inner_text()
        _shot(page, "queue-busy-approver")
        page.context.clear_cookies()

        _login(page, live_stack, "operator")
        page.wait_for_url(f"{live_stack.http}/admin/")
        page.click("text=Approvals queue")  # click 1
        card = page.locator(f"#approval-{first.pk}")
        assert (
            "stamp_invoice" in card.inner_text() and "stamp invoice INV-0001" in card.inner_text()
        )
        _shot(page, "queue-busy")
        card.locator("button[value=approve]").click()  # click 2
        page.wait_for_selector("text=Decided 1 approval(s).")
        assert "2 pending" in page.locator("#q-count").inner_text()

    with api(live_stack, key) as client:
        events = wait_events(
            client, sessions[0], turns_finished(1), timeout=60,
            describe=lambda: live_stack.log_tail("worker"),
        )  # fmt: skip
    assert Session.objects.get(pk=sessions[0]).state == "finished"
    answer = [e for e in events if e["type"] == "message.completed"][-1]["data"]
    assert answer["content"].startswith("Stamped at ")
    resolved = [e for e in events if e["type"] == "approval.resolved"]
    assert [(e["data"]["outcome"], e["data"]["by"]) for e in resolved] == [("approved", "operator")]

    with chromium() as browser:
        page = browser.new_page(viewport={"width": WIDTH, "height": 900})
        _login(page, live_stack, "operator")
        page.wait_for_url(f"{live_stack.http}/admin/")
        page.goto(f"{live_stack.http}/admin/approvals/approval/queue/")
        for box in page.locator("input[name=ids]").all():
            box.check()
        page.fill("#q-count ~ .q-bulk input[name=comment]", "duplicate invoices")
        page.click("text=Reject selected")
        page.wait_for_selector("text=Decided 2 approval(s).")
        assert "0 pending" in page.locator("#q-count").inner_text()
        _shot(page, "queue-empty")

        page.goto(f"{live_stack.http}/admin/agent_sessions/session/{sessions[0]}/change/")
        timeline = page.locator("#ap-timeline").inner_text()
        assert "approval stamp_invoice" in timeline and "approved by operator" in timeline
        assert page.locator("#ap-ops").is_visible()
        assert "TAKE OVER: REPLY TO THE USER" in page.locator("#ap-ops").inner_text().upper()
        overflow = page.evaluate("[document.body.scrollWidth, window.innerWidth]")
        assert overflow[0] <= overflow[1], overflow
        _shot(page, "session-approvals-takeover")

    for session_id in sessions[1:]:
        with api(live_stack, key) as client:
            wait_events(client, session_id, turns_finished(1), timeout=60)
        assert Approval.objects.get(session_id=session_id).comment == "duplicate invoices"
