"""A session's page names what else refers to it (evaluations, the schedule fire that started
it, its webhook deliveries), each a link both ways; only what the user may view, and no
evaluation of another tenant."""

import pytest
from django.utils import timezone

from hooks.models import Schedule, ScheduleFire, WebhookDelivery
from tests.factories import (
    EvaluationFactory,
    SessionFactory,
    StaffUserFactory,
    UserFactory,
    permissions,
)

pytestmark = pytest.mark.django_db


def _page(client, user, session) -> str:  # type: ignore[no-untyped-def]
    client.force_login(user)
    response = client.get(f"/admin/agent_sessions/session/{session.pk}/change/")
    assert response.status_code == 200
    return response.content.decode()


def test_the_related_links_are_the_users_own_and_only_those_it_may_open(client) -> None:  # type: ignore[no-untyped-def]
    reader = StaffUserFactory(username="reader", perms=["agent_sessions.view_session"])
    session = SessionFactory(owner=reader)
    schedule = Schedule.objects.create(name="nightly", cron="0 2 * * *", agent="a", owner=reader)
    ScheduleFire.objects.create(
        schedule=schedule, due=timezone.now(), status="started", session=session
    )
    delivery = WebhookDelivery.objects.create(session=session, turn=1, url="https://x.example")
    mine = EvaluationFactory(owner=reader)
    mine.sessions.add(session)
    theirs = EvaluationFactory(owner=UserFactory(username="stranger"))
    theirs.sessions.add(session)

    # May view sessions only: no link to a page that would answer 403.
    assert 'id="ap-related"' not in _page(client, reader, session)

    reader.user_permissions.add(
        *permissions(
            "evaluations.view_evaluation", "hooks.view_schedule", "hooks.view_webhookdelivery"
        )
    )
    reader = type(reader).objects.get(pk=reader.pk)  # a fresh permission cache
    html = _page(client, reader, session)
    assert f"/admin/evaluations/evaluation/{mine.pk}/change/" in html
    assert f"/admin/evaluations/evaluation/{theirs.pk}/change/" not in html
    assert f"/admin/hooks/schedule/{schedule.pk}/change/" in html
    assert f"/admin/hooks/webhookdelivery/{delivery.pk}/change/" in html
