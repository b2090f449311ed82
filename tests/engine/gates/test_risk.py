"""A tool's recent failures for the risk assessment (`engine.gates.risk.failure_counts`)."""

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from engine.gates.risk import failure_counts
from record.models import ToolCall
from tests.factories import SessionFactory
from tools.risk import FailureCount

pytestmark = pytest.mark.django_db


def _calls(tool: str, statuses: list[str], *, age: timedelta = timedelta(0)) -> None:
    session = SessionFactory.create()
    rows = ToolCall.objects.bulk_create(
        ToolCall(
            session=session,
            turn=1,
            step=1,
            position=i,
            call_id=f"c{i}",
            tool_name=tool,
            status=status,
            idempotency_key=uuid.uuid4().hex,
        )
        for i, status in enumerate(statuses)
    )
    if age:
        ToolCall.objects.filter(pk__in=[r.pk for r in rows]).update(created_at=timezone.now() - age)


def test_only_the_latest_finished_calls_within_the_hour_count():
    # Failures two hours old, then 25 finished calls and 3 still executing: the latest
    # 20 finished are 13 successes, a failure, a timeout and 5 of the first successes.
    _calls("pay", ["failed"] * 5, age=timedelta(hours=2))
    _calls("pay", ["success"] * 10 + ["timeout", "failed"] + ["success"] * 13 + ["executing"] * 3)
    # A rejected call finished without failing; 59 minutes ago is within the hour.
    _calls("notify", ["failed", "success", "failed", "rejected"])
    _calls("slow", ["timeout"], age=timedelta(minutes=59))
    _calls("slow", ["failed"], age=timedelta(minutes=61))
    counts = failure_counts(["pay", "notify", "pay", "slow", "never_called"])
    assert counts == {
        "pay": FailureCount(2, 20),
        "notify": FailureCount(2, 4),
        "slow": FailureCount(1, 1),
        "never_called": FailureCount(0, 0),
    }


def test_no_tools_asks_nothing(django_assert_num_queries):
    with django_assert_num_queries(0):
        assert failure_counts([]) == {}
