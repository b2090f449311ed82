"""50 runs at once, each wanting a 10-point tool, against 100 points: exactly 10 effects.

Real threads, each with its own database connection, run the engine in-process
(message_post + session_run) against the fake model server; a run whose points
are held by in-flight calls steps aside ("waiting") and is run again, as the
sweeper would.
"""

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection
from django.db.models import Sum
from django.test import override_settings

from billing.models import CreditAccount, CreditLedger, CreditReservation, UsageDaily
from billing.services import credits_grant
from sessions.engine import runner
from sessions.models import Session, ToolCall
from sessions.services import message_post
from tests.billing.conftest import call_then_answer
from tests.factories import SessionFactory, UserFactory

pytestmark = pytest.mark.django_db(transaction=True)

RUNS = 50


def _run_one(session_id: str) -> str:
    try:
        message_post(session=Session.objects.get(pk=session_id), content="charge me")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            result = runner.session_run(session_id=session_id)
            if result.stopped == "idle":
                return "idle"
            if result.stopped != "waiting":
                return result.stopped
            time.sleep(0.05)
            Session.objects.filter(pk=session_id).update(lease_expires_at=None)
        return "timeout"
    finally:
        connection.close()


@override_settings(CREDITS_WAIT_S=30)
def test_fifty_runs_against_a_hundred_points_make_exactly_ten_effects(
    paid_agent, openai_server, effects
):
    agent = paid_agent(points=10)
    owner = UserFactory()
    credits_grant(owner_id=owner.pk, points=100, actor="test")
    sessions = [str(SessionFactory(agent=agent, owner=owner).pk) for _ in range(RUNS)]
    openai_server.script(*[call_then_answer] * (2 * RUNS))

    with ThreadPoolExecutor(max_workers=RUNS) as pool:
        outcomes = list(pool.map(_run_one, sessions))

    assert outcomes == ["idle"] * RUNS
    assert effects() == 10
    account = CreditAccount.objects.get(owner=owner)
    assert (account.balance, account.reserved, account.spent_today) == (0, 0, 100)
    ledger = CreditLedger.objects.filter(account=account)
    assert ledger.aggregate(s=Sum("delta"))["s"] == account.balance
    assert ledger.filter(kind="reserve").count() == ledger.filter(kind="settle").count() == 10
    assert min(ledger.values_list("balance_after", flat=True)) >= 0
    calls = ToolCall.objects.filter(session__owner=owner)
    assert calls.filter(status="success").count() == 10
    assert calls.filter(status="rejected", output__code="insufficient_credits").count() == RUNS - 10
    assert not CreditReservation.objects.filter(status__in=["reserved", "waiting"]).exists()
    usage = UsageDaily.objects.get(owner=owner, agent=agent)
    assert (usage.tool_calls, usage.credits_spent, usage.model_calls) == (10, 100, 2 * RUNS)
