"""A decision's undo window on the live stack, in Chromium at 1400 px: the queue's Undo
button counts down without a reload, Undo within the window puts the call back in the
queue, and once the window ends the worker runs the call and a late REST withdraw is 409
saying when the step ran.

Screenshots go to ADMIN_SHOTS_DIR when it is set.
"""

import uuid
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission

from accounts.services import approver_grant
from approvals.models import Approval
from record.models import Session
from tests.e2e.support import api, create_session, post_message, turns_finished, wait_events
from tests.e2e.test_admin_pages import CHROMIUM, HAVE_BROWSER, WIDTH, _shot, chromium
from tests.e2e.test_approvals_admin_browser import PASSWORD, _agent, _login
from tests.factories import api_key_for
from tests.stack import Stack, running_stack

UNDO_S = 6

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        not HAVE_BROWSER,
        reason=f"needs the playwright package and Chromium at {CHROMIUM} "
        "(apt-get install chromium; `playwright install` is not used)",
    ),
]


@pytest.fixture(scope="module")
def undo_stack(django_db_setup, django_db_blocker):  # type: ignore[no-untyped-def]
    env = {"APPROVAL_UNDO_S": str(UNDO_S), "REDIS_KEY_PREFIX": f"test-undo-{uuid.uuid4().hex}"}
    with django_db_blocker.unblock(), running_stack(extra_env=env, ready_timeout=120) as stack:
        yield stack


def _requested(stack: Stack, key: str, slug: str) -> str:
    with api(stack, key) as client:
        session_id = create_session(client, slug)
        post_message(client, session_id, "stamp invoice INV-0001 please")
        wait_events(
            client,
            session_id,
            lambda events: any(e["type"] == "approval.requested" for e in events),
            timeout=60,
            describe=lambda: stack.log_tail("worker"),
        )
    return session_id


def _decide(page: Any, stack: Stack, approval: Approval) -> Any:
    page.goto(f"{stack.http}/admin/approvals/approval/queue/")
    page.locator(f"#approval-{approval.pk} button[value=approve]").click()
    page.wait_for_selector("text=Decided 1 approval(s).")
    return page.locator(f"#decided-{approval.pk} .q-undo")


def test_undo_within_the_window_then_the_run_goes_on_after_it(undo_stack: Stack):
    slug = _agent()
    key = api_key_for("customer")
    bob = get_user_model().objects.create_user("bob", password=PASSWORD, is_staff=True)
    # An approver who is not an operator: staff, the one permission to decide, and the group.
    bob.user_permissions.add(Permission.objects.get(codename="decide_approval"))
    approver_grant(username="bob")
    bob_key = api_key_for("bob")
    session_id = _requested(undo_stack, key, slug)
    approval = Approval.objects.get(session_id=session_id)

    with chromium() as browser:
        page = browser.new_page(viewport={"width": WIDTH, "height": 900})
        _login(page, undo_stack, "bob")
        page.wait_for_url(f"{undo_stack.http}/admin/approvals/approval/queue/")
        undo = _decide(page, undo_stack, approval)
        first = undo.inner_text()
        assert first.startswith("Undo · ") and first.endswith(" s"), first
        page.wait_for_function(
            "(t) => document.querySelector('.q-undo').innerText !== t", arg=first, timeout=3000
        )  # it counts down with no reload
        _shot(page, "undo-window-open")
        undo.click()
        page.wait_for_selector("text=waiting for a decision again")
        assert page.locator(f"#approval-{approval.pk}").count() == 1  # back in the queue

        # Approved again: this time the window runs out and the decision stands.
        _decide(page, undo_stack, approval)
        page.wait_for_selector(".q-ran", timeout=(UNDO_S + 3) * 1000)
        ran = page.locator(".q-ran").inner_text()
        assert ran.startswith("ran at ") and ran.endswith("stands"), ran
        _shot(page, "undo-window-closed")

    with api(undo_stack, key) as client:
        events = wait_events(
            client, session_id, turns_finished(1), timeout=60,
            describe=lambda: undo_stack.log_tail("worker"),
        )  # fmt: skip
    assert Session.objects.get(pk=session_id).state == "finished"
    outcomes = [e["data"]["outcome"] for e in events if e["type"] == "approval.resolved"]
    assert outcomes == ["approved", "withdrawn", "approved"]
    with api(undo_stack, bob_key) as client:
        late = client.post(f"/api/v1/approvals/{approval.pk}/withdraw/", json={})
    assert late.status_code == 409, late.text
    error = late.json()["error"]
    assert error["code"] == "call_started" and error["details"]["ran_at"] in error["message"]
