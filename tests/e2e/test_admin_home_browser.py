"""The admin home in Chromium at 1400 px: "what is wrong" above the app list, empty and
with a failing day, each figure a link to its filtered list."""

from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from approvals.models import Approval
from billing.models import OwnerBudget
from billing.notices import billing_today
from tests.e2e.test_admin_pages import CHROMIUM, HAVE_BROWSER, WIDTH, _shot, chromium
from tests.factories import AgentFactory, ModelEndpointFactory, SessionFactory, SpendDailyFactory

PASSWORD = "home-operator-pw"

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not HAVE_BROWSER, reason=f"needs playwright and Chromium at {CHROMIUM}"),
]


def _failing_day() -> None:
    owner = get_user_model().objects.create_user("alice", "alice@example.com", "pw")
    agent = AgentFactory(model=ModelEndpointFactory(name="rules", api="rules", options={}))
    for outcome in ("error", "error", "stopped", "tool_failures"):
        SessionFactory(owner=owner, agent=agent, last_turn_outcome=outcome)
    SessionFactory(owner=owner, agent=agent, state="processing")
    waiting = SessionFactory(owner=owner, agent=agent, state="awaiting_approval")
    Approval.objects.create(
        session=waiting, tool_name="refund", deadline=timezone.now() + timedelta(hours=1)
    )
    Approval.objects.filter(session=waiting).update(
        requested_at=timezone.now() - timedelta(hours=3)
    )
    SpendDailyFactory(owner=owner, agent_id=agent.pk, day=billing_today(), cost=Decimal("8.4"))
    OwnerBudget.objects.create(owner=owner, day_cost=Decimal("10"))


def test_the_home_says_what_is_wrong_above_the_app_list(live_stack: Any) -> None:
    get_user_model().objects.create_superuser("root", "root@example.com", PASSWORD)
    texts = []
    with chromium() as browser:
        page = browser.new_page(viewport={"width": WIDTH, "height": 1000})
        page.goto(f"{live_stack.http}/admin/login/")
        page.fill("#id_username", "root")
        page.fill("#id_password", PASSWORD)
        page.click("input[type=submit]")
        page.wait_for_url(f"{live_stack.http}/admin/")
        texts.append(page.inner_text(".ops-home"))
        _shot(page, "home-empty")
    _failing_day()
    with chromium() as browser:
        page = browser.new_page(viewport={"width": WIDTH, "height": 1000})
        page.goto(f"{live_stack.http}/admin/login/")
        page.fill("#id_username", "root")
        page.fill("#id_password", PASSWORD)
        page.click("input[type=submit]")
        page.wait_for_url(f"{live_stack.http}/admin/")
        texts.append(page.inner_text(".ops-home"))
        box = page.locator(".ops-home").bounding_box()
        apps = page.locator("#content-main .app-agent_sessions").bounding_box()
        _shot(page, "home-data")
        page.click("text=Turns failed (error), 24 h")
        listed = page.inner_text("#result_list")
    empty, busy = texts
    assert "Approvals pending\t0" in empty and "no owner day budget set" in empty
    assert "Turns failed (error), 24 h\t2" in busy
    assert "oldest waits 3 h" in busy and "alice: 8.40 of 10 (84 %)" in busy
    # Above the app list, and the page is not wider than the screen.
    assert box is not None and apps is not None and box["y"] < apps["y"]
    assert box["width"] <= WIDTH
    # The link is the filtered list: the two errored sessions, not the others.
    assert listed.count("alice") == 2
