"""The cost page in a real browser (Chromium) at 1,400 px on the live stack: a demo turn
over the API (the demo's rules model has a nominal price), earlier days' rollups for a
trend, a key budget the turn crosses; the chart, the breakdowns and the notice banner.

Set ADMIN_SHOTS_DIR (e.g. /tmp/cost) to keep the screenshots.
"""

from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth import get_user_model

from accounts.models import ApiKey
from billing.models import KeyBudget, OwnerBudget, SpendDaily, SpendNotice
from billing.notices import billing_today
from record.models import Agent, Session
from tests.demo_setup import DEMO_REQUEST, demo_install
from tests.e2e.support import api, create_session, post_message, turns_finished, wait_events
from tests.e2e.test_admin_pages import CHROMIUM, HAVE_BROWSER, WIDTH, _shot, chromium
from tests.factories import SpendDailyFactory, UsageDailyFactory, api_key_for

PASSWORD = "cost-pw-for-tests"

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        not HAVE_BROWSER,
        reason=f"needs the playwright package and Chromium at {CHROMIUM} "
        "(apt-get install chromium; `playwright install` is not used)",
    ),
]


def _trend(agent: Agent, owner: Any) -> None:
    """Three weeks of earlier spend on two models, some days without any (drawn as zero)."""
    today = billing_today()
    for back in range(1, 22):
        if back % 5 == 0:
            continue
        day = today - timedelta(days=back)
        big = Decimal("0.02") + Decimal(back % 7) / 100
        SpendDailyFactory(owner=owner, agent_id=agent.pk, day=day, endpoint="rules",
                          cost=big, input_tokens=4000, model_calls=3)  # fmt: skip
        UsageDailyFactory(owner=owner, agent=agent, day=day, cost=big, model_calls=3)
        if back % 3 == 0:
            SpendDailyFactory(owner=owner, agent_id=agent.pk, day=day,
                              endpoint="gpt-4o-mini", cost=Decimal("0.015"))  # fmt: skip


def test_the_cost_page_draws_spend_per_day_at_full_width_with_its_notices(live_stack: Any) -> None:
    demo_install()
    key = api_key_for("demo")
    demo = get_user_model().objects.get(username="demo")
    api_key = ApiKey.objects.get(owner=demo)
    agent = Agent.objects.get(slug="order-support")
    _trend(agent, demo)
    # The key spent 85 % of its month's budget earlier this month: the turn's first model
    # step raises the 80 % notice, and the rest of the budget still pays for the turn.
    KeyBudget.objects.create(api_key=api_key, owner=demo, period="month", cost=Decimal(1))
    SpendDailyFactory(owner=demo, agent_id=agent.pk, api_key_id=api_key.pk, shard=7,
                      day=billing_today().replace(day=1), cost=Decimal("0.85"))  # fmt: skip
    get_user_model().objects.create_superuser("operator", "op@example.com", PASSWORD)
    OwnerBudget.objects.create(owner=demo, day_cost=Decimal("0.1"))  # above every day's spend

    with api(live_stack, key) as client:
        session_id = create_session(client, "order-support")
        post_message(client, session_id, DEMO_REQUEST)
        wait_events(
            client, session_id, turns_finished(1), timeout=90,
            describe=lambda: live_stack.log_tail("worker"),
        )  # fmt: skip
    session = Session.objects.get(pk=session_id)
    assert session.api_key_id == api_key.pk and session.cost > 0  # the nominal price
    today_spend = SpendDaily.objects.filter(day=billing_today(), api_key_id=api_key.pk)
    assert today_spend.exists()
    assert SpendNotice.objects.filter(subject=f"key:{api_key.pk}:month", threshold=80).exists()

    with chromium() as browser:
        page = browser.new_page(viewport={"width": WIDTH, "height": 1000})
        page.goto(f"{live_stack.http}/admin/login/")
        page.fill("#id_username", "operator")
        page.fill("#id_password", PASSWORD)
        page.click("input[type=submit]")
        page.wait_for_url(f"{live_stack.http}/admin/")
        # The index names the page in words, and the banner is on every page.
        assert "Cost and usage" in page.inner_text("#content-main")
        assert "month budget of key" in page.inner_text("#cost-notices")

        page.goto(f"{live_stack.http}/admin/billing/usagedaily/?days=30&stack=model&group=key")
        chart = page.locator("#spend-chart")
        series = chart.locator("g.series")
        assert sorted(series.evaluate_all("gs => gs.map(g => g.dataset.series)")) == [
            "gpt-4o-mini",
            "rules",
        ]
        assert series.first.locator("rect").count() >= 10
        # The full width of the content at 1,400 px, not a third of it.
        box = chart.bounding_box()
        assert box is not None and box["width"] > 1200, box
        labels = chart.locator("text.x-label").all_text_contents()
        assert 5 <= len(labels) <= 15
        assert "total" in chart.locator("text.chart-total").text_content()
        # The owners' day budget, drawn where the spend can be read against it.
        assert chart.locator("g.budget-line text").text_content() == "day budget of 1 owner 0.1"
        width = page.evaluate("[document.body.scrollWidth, window.innerWidth]")
        assert width[0] <= width[1], width
        # The key's row links to its sessions.
        ranked = page.locator("#rankings a.ranked-link").first
        assert api_key.prefix in ranked.inner_text()
        _shot(page, "cost-by-model")

        page.goto(f"{live_stack.http}/admin/billing/usagedaily/?days=90&stack=agent&group=user")
        assert page.locator("#spend-chart g.series").evaluate_all(
            "gs => gs.map(g => g.dataset.series)"
        ) == ["order-support"]
        _shot(page, "cost-by-agent-90")
        page.locator("#rankings a.ranked-link", has_text="demo").click()
        page.wait_for_url("**/agent_sessions/session/?owner__id__exact=*")
        assert session_id[:8] in page.inner_text("#result_list")

        # Dismissed, the notice leaves every page.
        page.goto(f"{live_stack.http}/admin/")
        while page.locator("#cost-notices button.cost-notice-dismiss").count():
            page.locator("#cost-notices button.cost-notice-dismiss").first.click()
            page.wait_for_load_state()
        assert page.locator("#cost-notices").count() == 0
