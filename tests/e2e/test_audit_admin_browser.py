"""The audit trail, the fork preview and the live approvals queue in a real browser (Chromium)
on the live stack (daphne, a worker, beat).

Set ADMIN_SHOTS_DIR (e.g. /tmp/audit) to keep 1400 px wide screenshots of the pages.
"""

import uuid
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission

from accounts.services import api_key_create, approver_grant
from approvals.models import Approval
from audit.models import AuditEntry
from billing.services import credits_grant
from record.models import Checkpoint, Session
from tests.demo_setup import DEMO_REQUEST, demo_install
from tests.e2e.support import api, create_session, post_message, turns_finished, wait_events
from tests.e2e.test_admin_pages import CHROMIUM, HAVE_BROWSER, WIDTH, _shot, chromium
from tests.factories import AgentFactory, ModelEndpointFactory, ToolFactory, api_key_for

PASSWORD = "audit-pw-for-tests"

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        not HAVE_BROWSER,
        reason=f"needs the playwright package and Chromium at {CHROMIUM} "
        "(apt-get install chromium; `playwright install` is not used)",
    ),
]


def _login(page: Any, live_stack: Any, username: str) -> None:
    page.goto(f"{live_stack.http}/admin/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")


def _fits(page: Any) -> None:
    width = page.evaluate("[document.body.scrollWidth, window.innerWidth]")
    assert width[0] <= width[1], width


def _gated_agent() -> str:
    ToolFactory(
        name="stamp_invoice",
        description="Stamp an invoice as paid.",
        handler="builtin.current_time",
        side_effects=True,
        requires_approval=True,
        parameters={"type": "object", "properties": {"invoice": {"type": "string"}}},
    )
    slug = f"billing-{uuid.uuid4().hex[:6]}"
    AgentFactory(
        slug=slug,
        model=ModelEndpointFactory(name="rules", api="rules", options={}),
        tools=["stamp_invoice"],
        rules=[
            {"when": {"last_tool": "stamp_invoice"}, "answer": "Done: {{ result }}"},
            {"when": {"user": "stamp (\\S+)", "last_tool": None},
             "tool_calls": [{"tool": "stamp_invoice", "args": {"invoice": "{{ match.1 }}"}}]},
            {"answer": "?"},
        ],
    )  # fmt: skip
    return slug


def _ask(live_stack: Any, key: str, slug: str, invoice: str) -> str:
    """A session whose call waits for an approver; returns its id (HTTP only: no ORM)."""
    with api(live_stack, key) as client:
        session_id = create_session(client, slug)
        post_message(client, session_id, f"stamp {invoice}")
        wait_events(
            client, session_id,
            lambda events: any(e["type"] == "approval.requested" for e in events),
            timeout=60, describe=lambda: live_stack.log_tail("worker"),
        )  # fmt: skip
    return session_id


def test_the_queue_follows_new_and_decided_approvals_without_a_reload(live_stack):
    slug = _gated_agent()
    customer = api_key_for("customer")
    user = get_user_model().objects.create_user("bob", password=PASSWORD, is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="decide_approval"))
    approver_grant(username="bob")
    carol = api_key_create(username="carol", roles=[]).raw  # another approver, over REST
    approver_grant(username="carol")

    with chromium() as browser:
        page = browser.new_page(viewport={"width": WIDTH, "height": 900})
        _login(page, live_stack, "bob")
        page.wait_for_url(f"{live_stack.http}/admin/approvals/approval/queue/")
        page.wait_for_selector("#q-live.on", timeout=15_000)
        assert "0 pending" in page.locator("#q-count").inner_text()
        page.evaluate("window.__sameDocument = true")

        first = _ask(live_stack, customer, slug, "INV-1")
        page.wait_for_selector(".q-card", timeout=30_000)  # no reload: the socket said so
        assert "1 pending" in page.locator("#q-count").inner_text()
        assert "stamp INV-1" in page.locator(".q-card").inner_text()
        assert page.evaluate("window.__sameDocument === true")
        _fits(page)
        _shot(page, "queue-live-arrived")

        # Typing a comment: the next arrival is offered, not swapped in under the cursor.
        page.fill(".q-card input[name=comment]", "checking the invoice")
        second = _ask(live_stack, customer, slug, "INV-2")
        page.wait_for_selector("#q-live button", timeout=30_000)
        assert page.locator(".q-card").count() == 1
        assert page.locator(".q-card input[name=comment]").input_value() == "checking the invoice"
        _shot(page, "queue-live-offered")
        page.click("#q-live button")
        page.wait_for_function("document.querySelectorAll('.q-card').length === 2", timeout=15_000)

        # Another approver decides over REST: the card goes, still without a reload.
        with api(live_stack, carol) as client:
            pending = client.get("/api/v1/approvals/", params={"status": "pending"}).json()
            mine = next(a for a in pending if a["session"] == first)
            assert (
                client.post(f"/api/v1/approvals/{mine['id']}/approve/", json={}).status_code == 200
            )
        page.wait_for_function("document.querySelectorAll('.q-card').length === 1", timeout=30_000)
        assert "1 pending" in page.locator("#q-count").inner_text()
        assert page.evaluate("window.__sameDocument === true")
        _shot(page, "queue-live-decided")

    with api(live_stack, customer) as client:
        wait_events(client, first, turns_finished(1), timeout=60)
    assert Approval.objects.get(session_id=first).decided_by_name == "carol"
    assert Approval.objects.get(session_id=second).status == "pending"


def _demo_run(live_stack: Any) -> tuple[str, str]:
    demo_install()
    key = api_key_for("demo")
    with api(live_stack, key) as client:
        session_id = create_session(client, "order-support")
        post_message(client, session_id, DEMO_REQUEST)
        wait_events(
            client, session_id, turns_finished(1), timeout=90,
            describe=lambda: live_stack.log_tail("worker"),
        )  # fmt: skip
    return session_id, key


def test_a_fork_shows_the_calls_it_may_repeat_and_forks_only_when_confirmed(live_stack):
    session_id, _ = _demo_run(live_stack)
    get_user_model().objects.create_superuser("operator", "op@example.com", PASSWORD)
    before_sends = (
        Checkpoint.objects.filter(session_id=session_id, context__phase="tool_results")
        .order_by("step")
        .first()
    )
    assert before_sends is not None
    step = before_sends.step

    with chromium() as browser:
        page = browser.new_page(viewport={"width": WIDTH, "height": 900})
        _login(page, live_stack, "operator")
        page.wait_for_url(f"{live_stack.http}/admin/")

        # The checkpoints, each with what happened at its step and when, to the second.
        page.goto(f"{live_stack.http}/admin/agent_sessions/checkpoint/?q={session_id}")
        listed = page.locator("#result_list").inner_text()
        assert "tool intent: send_notification, send_notification, send_notification" in listed
        assert "tool results: query_orders=success" in listed
        assert "find last week" in listed
        _fits(page)
        _shot(page, "checkpoint-list")

        # Fork from the checkpoint before the notifications: the preview first.
        page.locator(
            f"#result_list tr:has(td.field-step:text-is('{step}')) input.action-select"
        ).check()
        page.select_option("select[name=action]", "fork_from_checkpoint")
        page.click("button[name=index]")
        page.wait_for_selector("#fork-preview")
        box = page.locator("#pv-repeats-box").inner_text()
        assert "MAY BE REPEATED: 4 SIDE-EFFECTING CALLS AFTER THIS CHECKPOINT" in box.upper()
        assert box.count("send_notification") == 3 and "generate_report" in box
        assert "took effect" in box.lower()
        _fits(page)
        _shot(page, "fork-preview")

        page.click("#fork-preview button[type=submit]")
        page.wait_for_selector("text=this is the new session")
        _shot(page, "fork-done")

        # Run a tool by hand: a preview with its risk, approval and cost first.
        page.goto(f"{live_stack.http}/admin/agent_sessions/session/{session_id}/change/")
        page.select_option("#ap-ops-tool", "send_notification")
        page.fill("#ap-ops-args", '{"customer_id": 1, "message": "Your parcel is on its way."}')
        page.click("button[value=run_tool]")
        page.wait_for_selector("#tool-preview")
        text = page.locator("#tool-preview").inner_text()
        assert "send_notification" in text and "level 1" in text and "10 points" in text
        _fits(page)
        _shot(page, "tool-run-preview")

    fork = Session.objects.get(forked_from_id=session_id)
    assert fork.forked_at_step == step
    assert AuditEntry.objects.filter(action="session.fork", object_id=session_id).count() == 1
    assert not AuditEntry.objects.filter(action="session.tool_run").exists()  # not confirmed


def test_the_audit_trail_lists_and_filters_what_people_did(live_stack):
    session_id, _ = _demo_run(live_stack)
    session = Session.objects.get(pk=session_id)
    root = get_user_model().objects.create_superuser("operator", "op@example.com", PASSWORD)
    credits_grant(owner_id=session.owner_id, points=500, actor="admin:operator", note="welcome")
    from sessions.services import session_fork, session_operator_reply

    session_operator_reply(session=session, content="We are on it.", actor="admin:operator")
    session_fork(session=Session.objects.get(pk=session_id), step=2, actor="admin:operator")
    assert root.pk

    with chromium() as browser:
        page = browser.new_page(viewport={"width": WIDTH, "height": 900})
        _login(page, live_stack, "operator")
        page.wait_for_url(f"{live_stack.http}/admin/")
        # An edit of a tool in the admin is an entry with the fields it changed.
        page.goto(f"{live_stack.http}/admin/tools/tool/?q=send_notification")
        page.click("#result_list a:text-is('send_notification')")
        page.fill("#id_timeout_s", "7")
        page.click("input[name=_save]")
        page.wait_for_selector(".messagelist .success")

        page.goto(f"{live_stack.http}/admin/audit/auditentry/")
        rows = page.locator("#result_list tbody tr")
        # The demo's install (apply_config) and its API key are on the trail too.
        assert rows.count() == 6
        listed = page.locator("#result_list").inner_text()
        for action in (
            "admin.change",
            "session.fork",
            "session.reply",
            "credits.grant",
            "config.apply",
            "apikey.create",
        ):
            assert action in listed, action
        assert "admin:operator" in listed and "timeout_s" in listed
        _fits(page)
        _shot(page, "audit-list")

        page.click("#changelist-filter a:text-is('session forked')")
        page.wait_for_selector("#result_list")
        assert page.locator("#result_list tbody tr").count() == 1
        _shot(page, "audit-list-filtered")
        page.locator("#result_list tbody tr th a").first.click()
        page.wait_for_selector("text=Details")
        detail = page.locator("#content-main").inner_text()
        assert "session.fork" in detail and "at_step" in detail
        _shot(page, "audit-entry")
