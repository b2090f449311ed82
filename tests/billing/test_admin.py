"""The billing admin: the cost page (series, breakdowns, links to sessions), the notice
banner on every admin page and its dismissal, and API key budgets."""

import re
import uuid
from datetime import timedelta
from decimal import Decimal

import pytest

from audit.models import AuditEntry
from billing.models import KeyBudget, SpendNotice
from billing.notices import billing_today
from tests.factories import (
    AgentFactory,
    SessionFactory,
    SpendDailyFactory,
    StaffUserFactory,
    UsageDailyFactory,
    UserFactory,
    api_key_for,
    permissions,
)

pytestmark = pytest.mark.django_db

COST = "/admin/billing/usagedaily/"


def test_the_index_names_the_cost_page_in_words(admin_client) -> None:  # type: ignore[no-untyped-def]
    html = admin_client.get("/admin/").content.decode()
    assert "Usage dailys" not in html and "Tool usage dailys" not in html
    assert ">Cost and usage<" in html


def test_the_cost_page_draws_the_chosen_range_stacked_by_model_or_agent(admin_client) -> None:  # type: ignore[no-untyped-def]
    today = billing_today()
    agent = AgentFactory(slug="helpdesk")
    SpendDailyFactory(day=today, endpoint="gpt-big", cost=Decimal("1.25"), agent_id=agent.pk)
    SpendDailyFactory(day=today - timedelta(days=20), endpoint="rules", cost=Decimal(2))
    UsageDailyFactory(agent=agent, day=today, cost=Decimal("1.25"))

    week = admin_client.get(COST, {"days": 7}).content.decode()
    assert re.findall(r'data-series="([^"]+)"', week) == ["gpt-big"]  # 20 days ago: outside
    start = (today - timedelta(days=6)).isoformat()
    assert f"Cost per day by model, {start} to {today.isoformat()}, total 1.25" in week

    month = admin_client.get(COST, {"days": 30}).content.decode()
    assert re.findall(r'data-series="([^"]+)"', month) == ["rules", "gpt-big"]
    assert ">total 3.25<" in month

    by_agent = admin_client.get(COST, {"days": 30, "stack": "agent"}).content.decode()
    assert re.findall(r'data-series="([^"]+)"', by_agent) == ["helpdesk"]
    # The toggles keep the other choice.
    assert 'href="?days=90&amp;stack=agent' in by_agent


def test_a_ranked_user_and_key_link_to_their_sessions(admin_client) -> None:  # type: ignore[no-untyped-def]
    today = billing_today()
    ann, bob = UserFactory(username="ann"), UserFactory(username="bob")
    api_key_for("ann")
    key = ann.api_keys.get()
    keyed = SessionFactory(owner=ann, api_key_id=key.pk)
    plain = SessionFactory(owner=ann)
    others = SessionFactory(owner=bob)
    UsageDailyFactory(owner=ann, day=today, cost=Decimal(3))
    UsageDailyFactory(owner=bob, day=today, cost=Decimal(1))
    SpendDailyFactory(owner=ann, day=today, api_key_id=key.pk, cost=Decimal(3))

    users = admin_client.get(COST, {"group": "user"}).content.decode()
    link = re.search(r'<a class="ranked-link" href="([^"]+)"[^>]*>ann</a>', users).group(1)
    listed = admin_client.get(link.replace("&amp;", "&")).content.decode()
    assert str(keyed.pk) in listed and str(plain.pk) in listed and str(others.pk) not in listed

    keys = admin_client.get(COST, {"group": "key"}).content.decode()
    link = re.search(r'<a class="ranked-link" href="([^"]+)"[^>]*>' + key.prefix, keys).group(1)
    listed = admin_client.get(link.replace("&amp;", "&")).content.decode()
    assert str(keyed.pk) in listed and str(plain.pk) not in listed
    # The spend groups show model calls' columns only.
    assert ">tool calls<" not in keys and ">model calls<" in keys


def _notice(**fields):  # type: ignore[no-untyped-def]
    today = billing_today()
    values = {
        "kind": "budget",
        "subject": "owner:1:month",
        "threshold": 80,
        "period_start": today.replace(day=1),
        "period_end": today + timedelta(days=1),
        "message": "owner month budget of owner 1: 80 % reached",
    }
    return SpendNotice.objects.create(**{**values, **fields})


def test_open_notices_show_on_every_admin_page_until_dismissed(admin_client) -> None:  # type: ignore[no-untyped-def]
    notice = _notice()
    _notice(subject="owner:2:day", message="period over", period_end=billing_today())
    for page in ("/admin/", COST, "/admin/billing/creditaccount/"):
        html = admin_client.get(page).content.decode()
        assert 'id="cost-notices"' in html and "80 % reached" in html, page
        assert "period over" not in html

    response = admin_client.post(f"/admin/billing/spendnotice/{notice.pk}/dismiss/", {"next": COST})
    assert response.status_code == 302 and response["Location"] == COST
    assert 'id="cost-notices"' not in admin_client.get("/admin/").content.decode()
    notice.refresh_from_db()
    assert notice.dismissed_at is not None and notice.dismissed_by == "admin:admin"
    entry = AuditEntry.objects.get(object_type="billing.spendnotice", object_id=str(notice.pk))
    assert entry.after == {"dismissed": True}


def test_a_dismiss_never_redirects_off_site(admin_client) -> None:  # type: ignore[no-untyped-def]
    notice = _notice()
    response = admin_client.post(
        f"/admin/billing/spendnotice/{notice.pk}/dismiss/", {"next": "https://evil.example/"}
    )
    assert response["Location"] == "/admin/billing/spendnotice/"


def _budget_notice(who: str, who_id: int, threshold: int, share: float, **fields):  # type: ignore[no-untyped-def]
    data = {
        "who": who, "id": who_id, "period": "day", "share": share, "spent_tokens": 0,
        "spent_cost": str(round(share * 10, 4)), "limit_tokens": None, "limit_cost": "10",
    }  # fmt: skip
    return _notice(
        subject=f"{who}:{who_id}:day",
        threshold=threshold,
        period_start=billing_today(),
        message=f"day budget of {who} {who_id}: {threshold} % reached",
        data=data,
        **fields,
    )


def test_the_banner_says_reached_at_the_limit_and_names_the_user_and_key(admin_client) -> None:  # type: ignore[no-untyped-def]
    alice = UserFactory(username="alice")
    _budget_notice("owner", alice.pk, 80, 0.85)
    _budget_notice("owner", alice.pk, 100, 1.02)
    api_key_for("carol")
    key = UserFactory._meta.model.objects.get(username="carol").api_keys.get()
    key.name = "billing-bot"
    key.save(update_fields=["name"])
    _budget_notice("key", key.pk, 80, 0.9)

    html = admin_client.get("/admin/").content.decode()
    banner = html[html.index('id="cost-notices"') :][:3000]

    # One line per budget: the limit reached, not also "80 %" beside it.
    assert "day budget of owner alice: reached (cost 10.2000 of 10)" in banner
    assert f"owner {alice.pk}" not in banner and "80 % reached" not in banner
    assert "day budget of key billing-bot of carol: 80 % used (cost 9.0000 of 10)" in banner


def test_staff_who_are_not_operators_see_no_banner(client) -> None:  # type: ignore[no-untyped-def]
    _notice()
    client.force_login(StaffUserFactory())
    assert 'id="cost-notices"' not in client.get("/admin/").content.decode()


def test_a_key_budget_is_saved_with_the_keys_owner_and_audited(admin_client) -> None:  # type: ignore[no-untyped-def]
    api_key_for("carol")
    owner = UserFactory._meta.model.objects.get(username="carol")
    key = owner.api_keys.get()
    response = admin_client.post(
        "/admin/billing/keybudget/add/",
        {"api_key": key.pk, "period": "month", "tokens": "", "cost": "12.5"},
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    budget = KeyBudget.objects.get(api_key=key)
    assert budget.owner_id == owner.pk and budget.cost == Decimal("12.5")
    assert AuditEntry.objects.filter(object_type="billing.keybudget", action="admin.add").exists()


def test_a_staff_user_cannot_budget_another_tenants_key(client) -> None:  # type: ignore[no-untyped-def]
    api_key_for("dave")
    theirs = UserFactory._meta.model.objects.get(username="dave").api_keys.get()
    staff = StaffUserFactory(username="erin")
    staff.user_permissions.set(permissions("billing.add_keybudget", "billing.view_keybudget"))
    client.force_login(staff)
    response = client.post(
        "/admin/billing/keybudget/add/", {"api_key": theirs.pk, "period": "day", "tokens": "5"}
    )
    assert response.status_code == 200  # the form again, with an error on the key
    assert "api_key" in response.context["adminform"].form.errors
    assert not KeyBudget.objects.exists()


# --- Credit pools and their queue --------------------------------------------------------


def _queue(owner, pool, **fields):  # type: ignore[no-untyped-def]
    from billing.models import PoolRequest

    defaults = {"action": "issue_coupon", "value": 1.0, "cost": 10, "roi": 0.1, "status": "waiting"}
    defaults.update(fields)
    return PoolRequest.objects.create(
        key=f"pool:{uuid.uuid4()}", pool=pool, owner=owner, session_id=uuid.uuid4(), **defaults
    )


def test_the_queue_shows_waiting_requests_in_grant_order_with_roi_value_cost_age_and_level(
    admin_client,
) -> None:  # type: ignore[no-untyped-def]
    from billing.models import CreditPool

    owner = UserFactory()
    pool = CreditPool.objects.create(name="global", size=100, in_use=90)
    _queue(owner, pool, action="low", value=8.0, cost=10, roi=0.8)
    _queue(owner, pool, action="high", value=12.0, cost=10, roi=1.2)
    _queue(owner, pool, action="done", status="released")
    html = admin_client.get("/admin/billing/poolrequest/").content.decode()
    assert html.index(">high<") < html.index(">low<")  # the order they will be granted in
    assert ">done<" not in html  # the queue: waiting ones only, unless the filter says
    assert ">1.2<" in html and ">12.0<" in html and "global: 90 / 100 (90 %)" in html
    assert re.search(r'class="field-age">\d+ s<', html)
    every = admin_client.get("/admin/billing/poolrequest/", {"status": "all"}).content.decode()
    assert ">done<" in every
    pools = admin_client.get("/admin/billing/creditpool/").content.decode()
    assert "90 / 100 (90 %)" in pools and "2 waiting" in pools


def test_a_view_only_staff_user_sees_their_tenants_queue_and_changes_nothing(client) -> None:  # type: ignore[no-untyped-def]
    from billing.models import CreditPool, PoolRequest

    staff = StaffUserFactory(username="viewer-pool")
    staff.user_permissions.set(permissions("billing.view_poolrequest", "billing.view_creditpool"))
    pool = CreditPool.objects.create(name="global", size=10)
    mine = _queue(staff, pool, action="mine")
    _queue(UserFactory(), pool, action="theirs")
    client.force_login(staff)
    html = client.get("/admin/billing/poolrequest/").content.decode()
    assert ">mine<" in html and ">theirs<" not in html
    assert client.get(f"/admin/billing/poolrequest/{mine.pk}/change/").status_code == 200
    response = client.post(
        f"/admin/billing/poolrequest/{mine.pk}/change/", {"status": "granted", "roi": "99"}
    )
    assert response.status_code == 403
    assert client.post(f"/admin/billing/poolrequest/{mine.pk}/delete/").status_code == 403
    assert PoolRequest.objects.get(pk=mine.pk).status == "waiting"
    # A hostile filter value lists nothing; it is not a 500.
    assert client.get("/admin/billing/poolrequest/", {"status": "x' OR 1=1"}).status_code == 200


def test_the_queues_pool_filter_names_no_other_tenants_pool(client) -> None:  # type: ignore[no-untyped-def]
    """Issue 43: a staff user who owns nothing reads no other tenant's pool by its name in
    the queue's filter; their own and the global pool are offered."""
    from billing.models import CreditPool

    staff = StaffUserFactory(username="viewer-pools")
    staff.user_permissions.set(permissions("billing.view_poolrequest", "billing.view_creditpool"))
    CreditPool.objects.create(name="global-pool", size=10)
    CreditPool.objects.create(name="mine-pool", size=10, owner=staff)
    other = UserFactory()
    CreditPool.objects.create(name="acme-secret-pool", size=10, owner=other)
    client.force_login(staff)

    html = client.get("/admin/billing/poolrequest/", {"status": "all"}).content.decode()
    assert "global-pool" in html and "mine-pool" in html
    assert "acme-secret-pool" not in html
    pools = client.get("/admin/billing/creditpool/").content.decode()
    assert "acme-secret-pool" not in pools


def test_an_operator_edits_a_pool_but_never_its_level(admin_client) -> None:  # type: ignore[no-untyped-def]
    from billing.models import CreditPool

    pool = CreditPool.objects.create(name="global", size=10, in_use=4)
    response = admin_client.post(
        f"/admin/billing/creditpool/{pool.pk}/change/",
        {"name": "global", "owner": "", "size": "20", "enabled": "on", "in_use": "0"},
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    pool.refresh_from_db()
    assert (pool.size, pool.in_use) == (20, 4)
    assert AuditEntry.objects.filter(
        object_type="billing.creditpool", action="admin.change"
    ).exists()
    bad = admin_client.post(
        f"/admin/billing/creditpool/{pool.pk}/change/",
        {"name": "global", "owner": "", "size": "-1", "enabled": "on"},
    )
    assert bad.status_code == 200  # the form again: a size must be at least 1
    pool.refresh_from_db()
    assert pool.size == 20
