"""The cost notices' webhook (billing/webhook.py, billing/tasks.py): signed like the
approvals webhook, sent after the notice's commit from a Celery task, to a real HTTP
server on 127.0.0.1, once per notice."""

import json
import threading
from collections.abc import Iterator
from datetime import date
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pytest
from django.db import transaction
from django.test import override_settings

from agentplatform.celery import app
from billing.budgets import Budget, Spent
from billing.models import OwnerBudget, SpendNotice
from billing.notices import notice_candidates
from billing.pressure import owner_watch_reset
from billing.services import notices_raise, notices_seen_reset
from billing.tasks import notice_webhook_send
from billing.webhook import SIGNATURE_HEADER, notice_post
from engine import session_run
from record.models import ModelCall
from runtime.webhooks import WebhookFailed, signature_valid
from sessions.services import message_post
from tests.factories import UserFactory
from tests.sessions.conftest import make_agent, make_session, owner, rules_model  # noqa: F401

received: list[tuple[bytes, str]] = []


class Receiver(BaseHTTPRequestHandler):
    status = 200

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        received.append((body, self.headers.get(SIGNATURE_HEADER, "")))
        self.send_response(type(self).status)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def receiver(settings) -> Iterator[str]:  # type: ignore[no-untyped-def]
    received.clear()
    server = HTTPServer(("127.0.0.1", 0), Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    settings.COST_NOTICE_WEBHOOK_URL = f"http://127.0.0.1:{server.server_port}/cost"
    settings.COST_NOTICE_WEBHOOK_SECRET = "c0st"
    settings.COST_NOTICE_THRESHOLDS = [80, 100]
    notices_seen_reset()
    yield settings.COST_NOTICE_WEBHOOK_URL
    server.shutdown()
    Receiver.status = 200


@pytest.fixture
def eager() -> Iterator[None]:
    """Tasks run in-process at .delay() (the broker is not needed to see the POST)."""
    before = app.conf.task_always_eager
    app.conf.task_always_eager = True
    yield
    app.conf.task_always_eager = before


def test_a_delivery_is_signed_the_approvals_way(receiver) -> None:  # type: ignore[no-untyped-def]
    assert notice_post({"type": "cost.notice", "id": 1}) == 200
    [(body, header)] = received
    assert json.loads(body) == {"type": "cost.notice", "id": 1}
    assert signature_valid("c0st", body, header)
    assert not signature_valid("other", body, header)


def test_a_refused_delivery_raises_so_the_task_retries(receiver) -> None:  # type: ignore[no-untyped-def]
    Receiver.status = 503
    with pytest.raises(WebhookFailed):
        notice_post({"type": "cost.notice"})
    assert notice_webhook_send.autoretry_for == (WebhookFailed,)
    assert notice_webhook_send.retry_backoff is True


@pytest.mark.django_db(transaction=True)
def test_a_new_notice_is_posted_after_its_commit_and_recorded(receiver, eager) -> None:  # type: ignore[no-untyped-def]
    user = UserFactory()
    found = notice_candidates(
        budgets=[(Budget("owner", "month", tokens=100), Spent(90))],
        owner_id=user.pk,
        agent_id=1,
        api_key_id=None,
        today=date(2026, 5, 20),
    )
    with transaction.atomic():
        [notice_id] = notices_raise(found)
        assert received == []  # nothing leaves before the commit
    [(body, header)] = received
    payload = json.loads(body)
    assert payload["type"] == "cost.notice" and payload["id"] == notice_id
    assert payload["subject"] == f"owner:{user.pk}:month" and payload["threshold"] == 80
    assert payload["period_start"] == "2026-05-01" and payload["period_end"] == "2026-06-01"
    assert signature_valid("c0st", body, header)
    notice = SpendNotice.objects.get(pk=notice_id)
    assert notice.webhook_sent_at is not None and notice.webhook_status == "HTTP 200"


@pytest.mark.django_db(transaction=True)
def test_a_step_crossing_a_day_budget_notices_once_per_threshold(
    receiver,
    eager,
    make_agent,  # noqa: F811
    make_session,  # noqa: F811
    owner,  # noqa: F811
) -> None:  # type: ignore[no-untyped-def]
    session = make_session(agent=make_agent())
    message_post(session=session, content="hello")
    assert session_run(session_id=session.pk).stopped == "idle"
    used = ModelCall.objects.get(session=session)
    tokens = used.input_tokens + used.output_tokens
    # What the owner spent today is 85 % of the day budget set now: the next step notices.
    OwnerBudget.objects.create(owner=owner, day_tokens=int(tokens / 0.85))
    owner_watch_reset()
    for text in ("one", "two"):
        message_post(session=session, content=text)
        session_run(session_id=session.pk)

    notices = list(SpendNotice.objects.filter(owner=owner).order_by("threshold"))
    assert [n.threshold for n in notices][:1] == [80]
    assert notices[0].subject == f"owner:{owner.pk}:day"
    # One POST per notice row, however many steps saw the crossing.
    posted = [json.loads(body)["id"] for body, _ in received]
    assert sorted(posted) == [n.pk for n in notices]


@pytest.mark.django_db
def test_a_notice_for_a_refused_address_is_recorded_as_failing_not_sent_nor_retried(
    receiver,
) -> None:  # type: ignore[no-untyped-def]
    notice = SpendNotice.objects.create(
        kind="budget",
        subject="owner:1:month",
        threshold=80,
        period_start=date(2026, 5, 1),
        period_end=date(2026, 6, 1),
        message="80% of the month's budget",
    )
    with override_settings(EGRESS_ALLOW=[]):
        assert notice_webhook_send(notice.pk) == 0  # returned: no retry is scheduled
    assert received == []
    notice.refresh_from_db()
    assert notice.webhook_sent_at is None
    assert notice.webhook_status == (
        "failed: egress refused: 127.0.0.1 is a loopback address that EGRESS_ALLOW does not list"
    )
