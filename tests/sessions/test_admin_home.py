"""The admin home answers "what is wrong" above the app list: failed and stopped turns of
the last 24 h, runs in flight, pending approvals with the oldest's age, today's spend
against the owner budgets, workers alive and open breakers, each a link to its list.
A staff user sees their own tenant's figures and only the lines their permissions open."""

import time
from datetime import timedelta
from decimal import Decimal

import pytest
from django.contrib.auth.models import Permission
from django.utils import timezone

from approvals.models import Approval
from billing.models import OwnerBudget
from billing.notices import billing_today
from record.models import Session
from runtime import health
from runtime.breaker import model_breaker
from sessions.selectors import home_figures
from tests.factories import SpendDailyFactory, StaffUserFactory, UserFactory

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _clean_redis():  # type: ignore[no-untyped-def]
    yield
    client = health._redis()
    for pattern in (f"{health._prefix()}:*", "*breaker:*"):
        for key in client.scan_iter(pattern):
            client.delete(key)


def _data(make_session, owner):  # type: ignore[no-untyped-def]
    other = UserFactory(username="stranger")
    make_session(last_turn_outcome="error")
    make_session(last_turn_outcome="stopped")
    make_session(last_turn_outcome="stopped")
    make_session(state="processing")
    old = make_session(last_turn_outcome="error")
    Session.objects.filter(pk=old.pk).update(updated_at=timezone.now() - timedelta(days=2))
    theirs = make_session(owner=other, last_turn_outcome="error", state="tool_wait")
    mine = make_session(state="awaiting_approval")
    Approval.objects.create(
        session=mine, tool_name="pay", deadline=timezone.now() + timedelta(hours=1)
    )
    Approval.objects.filter(session=mine).update(
        requested_at=timezone.now() - timedelta(minutes=42)
    )
    Approval.objects.create(
        session=theirs, tool_name="pay", deadline=timezone.now() + timedelta(hours=1)
    )
    SpendDailyFactory(owner=owner, day=billing_today(), cost=Decimal("9.5"))
    SpendDailyFactory(owner=other, day=billing_today(), cost=Decimal("1"))
    OwnerBudget.objects.create(owner=owner, day_cost=Decimal("10"))
    return other


def test_the_figures_count_the_last_day_by_outcome_and_scope_a_tenant(make_session, owner):  # type: ignore[no-untyped-def]
    _data(make_session, owner)

    every = home_figures(owner_id=None)
    assert every.not_ok == {"error": 2, "stopped": 2, "tool_failures": 0}
    assert every.running == 2 and every.approvals_pending == 2
    assert every.spend_today == Decimal("10.5")
    assert [(b.username, round(b.share, 2)) for b in every.budgets] == [("owner", 0.95)]

    mine = home_figures(owner_id=owner.pk)
    assert mine.not_ok == {"error": 1, "stopped": 2, "tool_failures": 0}
    assert mine.running == 1 and mine.approvals_pending == 1
    assert mine.spend_today == Decimal("9.5")


def test_a_superuser_sees_every_line_with_links(client, make_session, owner):  # type: ignore[no-untyped-def]
    _data(make_session, owner)
    health.report_publish(
        health.Report(
            name="w1@host", pid=1, at=time.time(), inflight=0, steps=0, step_p50_s=0.0,
            step_p95_s=0.0, error_rate=0.0, model_p95_s=0.0, cpu_percent=0.0, rss_mb=1.0,
            accepting=True, reasons=[],
        ),
        ttl_s=30,
    )  # fmt: skip
    breaker = model_breaker()
    for _ in range(breaker.threshold):
        breaker.record_failure("flaky-model")
    client.force_login(UserFactory(username="root", is_staff=True, is_superuser=True))

    html = client.get("/admin/").content.decode()

    assert "What is wrong" in html
    assert "Turns failed (error), 24 h" in html
    assert "last_turn=error&amp;updated_at__gte=" in html
    assert "state__in=processing%2Ctool_wait%2Ctool_loop" in html
    assert "Approvals pending" in html and "oldest waits 42 min" in html
    section = html[html.index("What is wrong") : html.index("app-agent_sessions")]
    assert "Spend today" in html and "10.50" in html, section
    assert "owner: 9.50 of 10 (95 %)" in html, section
    assert "Workers alive" in html and "/admin/agent_sessions/workerhealth/" in html
    assert "model flaky-model (open" in html
    # The app list stays below.
    assert html.index("What is wrong") < html.index('class="app-agent_sessions')


def test_a_staff_user_sees_their_tenant_and_only_what_they_may(client, make_session, owner):  # type: ignore[no-untyped-def]
    _data(make_session, owner)
    staff = StaffUserFactory(username="ops")
    staff.user_permissions.add(
        Permission.objects.get(codename="view_session", content_type__app_label="agent_sessions")
    )
    # The staff user is the tenant: their sessions are the owner's ones re-owned.
    Session.objects.filter(owner=owner).update(owner=staff)
    client.force_login(staff)

    html = client.get("/admin/").content.decode()

    assert "Turns failed (error), 24 h" in html
    # Their one recent error, not the stranger's.
    assert ">1</a>" in html.split("Turns failed (error)")[1][:400]
    assert "Approvals pending" not in html
    assert "Spend today" not in html
    assert "Workers alive" not in html and "circuit breakers" not in html


def test_a_staff_user_with_no_permission_gets_the_stock_index(client):  # type: ignore[no-untyped-def]
    client.force_login(StaffUserFactory(username="nobody"))
    html = client.get("/admin/").content.decode()
    assert "What is wrong" not in html


def test_a_reader_of_approvals_who_is_not_an_approver_is_sent_to_their_list_not_the_queue(
    client,  # type: ignore[no-untyped-def]
) -> None:
    """The queue answers 403 to anyone but a superuser or an approver: the home's line links
    a staff user who may only read approvals to the pending ones' list, which reads."""
    reader = StaffUserFactory(username="reader", perms=["approvals.view_approval"])
    client.force_login(reader)

    html = client.get("/admin/").content.decode()

    line = html.split("Approvals pending")[0].rsplit("<a ", 1)[1]
    assert 'href="/admin/approvals/approval/?status__exact=pending"' in line
    assert client.get("/admin/approvals/approval/?status__exact=pending").status_code == 200
    assert client.get("/admin/approvals/approval/queue/").status_code == 403
