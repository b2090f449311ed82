"""Schedules and run webhooks' deliveries in the admin: a schedule added or changed in the
admin is checked as in a config file, audited, and shows its next fire times; deliveries
show sent, failing, attempts and the last error, and are not edited by hand."""

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from audit.models import AuditEntry
from hooks.models import Schedule, ScheduleFire, WebhookDelivery
from tests.factories import (
    AgentFactory,
    ModelEndpointFactory,
    SessionFactory,
    StaffUserFactory,
    UserFactory,
    permissions,
)

pytestmark = pytest.mark.django_db

ADD = "/admin/hooks/schedule/add/"


@pytest.fixture
def admin_client() -> Client:
    user = UserFactory(username="root", is_staff=True, is_superuser=True)
    client = Client()
    client.force_login(user)
    return client


def _form(**values: Any) -> dict[str, Any]:
    agent = AgentFactory(slug="support", model=ModelEndpointFactory(name="rules", api="rules"))
    form = {
        "name": "morning",
        "enabled": "on",
        "cron": "0 7 * * 1-5",
        "timezone": "Europe/Berlin",
        "workflow": "",
        "input": "{}",
        "agent": agent.slug,
        "message": "What is due today?",
        "owner": str(UserFactory(username="ops").pk),
        "api_key": "",
        "overlap": "skip",
        "webhook_url": "",
        "fires-TOTAL_FORMS": "0",
        "fires-INITIAL_FORMS": "0",
        "fires-MIN_NUM_FORMS": "0",
        "fires-MAX_NUM_FORMS": "0",
    }
    form.update(values)
    return form


def test_an_added_schedule_is_audited_and_shows_its_next_fire_times(admin_client: Client):
    answer = admin_client.post(ADD, _form())
    assert answer.status_code == 302, answer.content.decode()[:3000]
    schedule = Schedule.objects.get(name="morning")
    assert schedule.next_due_at is not None and schedule.next_due_at > timezone.now()
    entry = AuditEntry.objects.get(action="admin.add", object_type="hooks.schedule")
    assert entry.actor == "admin:root" and entry.after["cron"] == "0 7 * * 1-5"

    listing = admin_client.get("/admin/hooks/schedule/").content.decode()
    local = schedule.next_due_at.astimezone(__import__("zoneinfo").ZoneInfo("Europe/Berlin"))
    assert (
        local.strftime("%Y-%m-%d 07:00 CET") in listing
        or local.strftime("%Y-%m-%d 07:00 CEST") in listing
    )

    # A new cron moves the next due time, and the change is audited with before and after.
    Schedule.objects.filter(pk=schedule.pk).update(next_due_at=timezone.now() + timedelta(days=30))
    changed = admin_client.post(
        f"/admin/hooks/schedule/{schedule.pk}/change/", _form(cron="30 6 * * *")
    )
    assert changed.status_code == 302, changed.content.decode()[:3000]
    schedule.refresh_from_db()
    assert schedule.next_due_at < timezone.now() + timedelta(days=2)
    entry = AuditEntry.objects.get(action="admin.change", object_type="hooks.schedule")
    assert (entry.before["cron"], entry.after["cron"]) == ("0 7 * * 1-5", "30 6 * * *")


@pytest.mark.parametrize(
    ("values", "says"),
    [
        ({"cron": "every day"}, "is not five fields"),
        ({"timezone": "Mars/Base"}, "unknown time zone"),
        ({"workflow": "nightly"}, "name a workflow, or an agent"),
        ({"agent": "ghost"}, "unknown agent"),
        ({"message": ""}, "required with an agent"),
        ({"webhook_url": "http://169.254.169.254/"}, "egress refused"),
    ],
)
def test_a_wrong_schedule_is_refused_inline_and_nothing_is_saved(
    admin_client: Client, settings, values, says
):
    settings.EGRESS_ALLOW = []
    answer = admin_client.post(ADD, _form(**values))
    assert answer.status_code == 200 and says in answer.content.decode()
    assert not Schedule.objects.exists() and not AuditEntry.objects.exists()


def test_deliveries_show_their_state_and_cannot_be_edited(admin_client: Client):
    session = SessionFactory()
    WebhookDelivery.objects.create(
        session=session, turn=3, url="https://app.example/h", status="failing", attempts=4,
        last_error="ReadTimeout",
    )  # fmt: skip
    listing = admin_client.get("/admin/hooks/webhookdelivery/?status=failing").content.decode()
    assert f"{session.pk}:3" in listing and "ReadTimeout" in listing and "failing" in listing
    assert admin_client.get("/admin/hooks/webhookdelivery/add/").status_code == 403


def test_a_staff_user_reads_only_their_tenants_deliveries_and_their_bodies_need_content(
    client: Client,
):
    """Issue 43: a delivery's body is the turn's outcome and a run's result (what the
    session said): another tenant's deliveries are not reached at all, and the tenant's own
    body needs view_message_content, as the session's messages do."""
    staff = StaffUserFactory(perms=["hooks.view_webhookdelivery"])
    mine = WebhookDelivery.objects.create(
        session=SessionFactory(owner=staff), turn=1, url="https://app.example/mine",
        finished={"result": {"answer": "MINE-PLANTED"}},
    )  # fmt: skip
    theirs = WebhookDelivery.objects.create(
        session=SessionFactory(), turn=1, url="https://app.example/theirs",
        finished={"result": {"answer": "THEIRS-PLANTED"}},
    )  # fmt: skip
    client.force_login(staff)

    listing = client.get("/admin/hooks/webhookdelivery/").content.decode()
    assert "/mine" in listing and "/theirs" not in listing
    assert client.get(f"/admin/hooks/webhookdelivery/{theirs.pk}/change/").status_code == 302
    page = client.get(f"/admin/hooks/webhookdelivery/{mine.pk}/change/").content.decode()
    assert "MINE-PLANTED" not in page and "needs the view_message_content permission" in page

    staff.user_permissions.add(*permissions("agent_sessions.view_message_content"))
    client.force_login(type(staff).objects.get(pk=staff.pk))
    page = client.get(f"/admin/hooks/webhookdelivery/{mine.pk}/change/").content.decode()
    assert "MINE-PLANTED" in page


def _fired(name: str, session: Any) -> Schedule:
    schedule = Schedule.objects.create(
        name=name, cron="0 7 * * *", timezone="UTC", agent="support", message="hi",
        owner=session.owner,
    )  # fmt: skip
    for days, status in ((2, "skipped"), (1, "started")):
        ScheduleFire.objects.create(
            schedule=schedule, due=timezone.now() - timedelta(days=days), status=status,
            session=session if status == "started" else None,
        )  # fmt: skip
    return schedule


def test_the_schedule_lists_last_fire_costs_no_query_per_row(admin_client: Client) -> None:
    """Found in a browser walk: the "last fire" column ran a query per schedule."""
    session = SessionFactory()
    _fired("one", session)

    def listed() -> tuple[str, int]:
        with CaptureQueriesContext(connection) as queries:
            page = admin_client.get("/admin/hooks/schedule/")
        assert page.status_code == 200
        return page.content.decode(), len(queries)

    html, few = listed()
    assert f'started <a href="/admin/agent_sessions/session/{session.pk}/change/">' in html
    for n in range(5):
        _fired(f"more-{n}", SessionFactory())
    html, many = listed()
    assert html.count("started <a href=") == 6
    assert many == few, (few, many)


def test_links_to_pages_the_user_may_not_view_are_plain_text(client: Client) -> None:
    """A staff user who may see schedules and deliveries but not sessions gets the session
    ids as text, not links that end in a 403."""
    staff = StaffUserFactory(
        perms=["hooks.view_schedule", "hooks.view_schedulefire", "hooks.view_webhookdelivery"]
    )
    session = SessionFactory(owner=staff)
    schedule = _fired("mine", session)
    delivery = WebhookDelivery.objects.create(
        session=session, turn=1, url="https://app.example/h", status="sent"
    )
    client.force_login(staff)
    session_url = f"/admin/agent_sessions/session/{session.pk}/change/"
    assert client.get(session_url).status_code == 403

    pages = [
        client.get("/admin/hooks/schedule/"),
        client.get(f"/admin/hooks/schedule/{schedule.pk}/change/"),
        client.get(f"/admin/hooks/webhookdelivery/{delivery.pk}/change/"),
    ]
    for page in pages:
        assert page.status_code == 200
        html = page.content.decode()
        assert session_url not in html, page.request["PATH_INFO"]
        assert str(session.pk)[:8] in html
    # The schedule's page links its fire's delivery (viewable), the delivery its schedule.
    assert f"/admin/hooks/webhookdelivery/{delivery.pk}/change/" in pages[1].content.decode()
    assert f"/admin/hooks/schedule/{schedule.pk}/change/" in pages[2].content.decode()

    staff.user_permissions.add(*permissions("agent_sessions.view_session"))
    client.force_login(type(staff).objects.get(pk=staff.pk))
    for url in ("/admin/hooks/schedule/", f"/admin/hooks/webhookdelivery/{delivery.pk}/change/"):
        assert session_url in client.get(url).content.decode()
