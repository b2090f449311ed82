"""Cost notices: which crossings a step's budgets make (billing/notices.py), and their
rows raised once per threshold and period, also under concurrency (billing/services.py)."""

import threading
from datetime import date
from decimal import Decimal

import pytest
from django.db import connection, transaction

from billing.budgets import Budget, Spent
from billing.models import SpendNotice
from billing.notices import notice_candidates, period_bounds
from billing.services import notice_insert, notices_raise, notices_seen_reset
from tests.factories import UserFactory

TODAY = date(2026, 2, 14)


def _subjects(found):  # type: ignore[no-untyped-def]
    return [(n.subject, n.threshold) for n in found]


def test_each_threshold_reached_is_a_candidate(settings) -> None:
    settings.COST_NOTICE_THRESHOLDS = [80, 100]
    found = notice_candidates(
        budgets=[
            (Budget("owner", "month", cost=Decimal(10)), Spent(0, Decimal("8.5"))),
            (Budget("API key", "day", tokens=1000), Spent(1000)),
            (Budget("agent", "day", tokens=1000), Spent(10)),
            # A run's own limits are no operator's notice.
            (Budget("owner", "turn", tokens=10), Spent(50)),
            (Budget("agent", "session", tokens=10), Spent(50)),
            # No limit set.
            (Budget("owner", "day"), Spent(10**6)),
        ],
        owner_id=5,
        agent_id=6,
        api_key_id=7,
        today=TODAY,
    )
    assert _subjects(found) == [("owner:5:month", 80), ("key:7:day", 80), ("key:7:day", 100)]
    month = found[0]
    assert (month.period_start, month.period_end) == (date(2026, 2, 1), date(2026, 3, 1))
    assert "80 % used" in month.message and "8.5" in month.message
    # At the limit the budget gate refuses turns: the notice says so, not "80 %".
    assert [n.message.split(": ")[1].split(" (")[0] for n in found[1:]] == ["reached", "reached"]
    assert found[1].period_end == date(2026, 2, 15)


def test_the_thresholds_are_configurable(settings) -> None:
    settings.COST_NOTICE_THRESHOLDS = [50]
    found = notice_candidates(
        budgets=[(Budget("owner", "day", tokens=100), Spent(60))],
        owner_id=1,
        agent_id=1,
        api_key_id=None,
        today=TODAY,
    )
    assert _subjects(found) == [("owner:1:day", 50)]


def test_a_balance_under_its_low_water_mark_is_a_candidate_for_the_day() -> None:
    low = notice_candidates(budgets=[], owner_id=3, agent_id=1, api_key_id=None,
                            credits=(40, 50), today=TODAY)  # fmt: skip
    assert _subjects(low) == [("credits:3", 0)]
    assert (low[0].period_start, low[0].period_end) == (TODAY, date(2026, 2, 15))
    assert notice_candidates(budgets=[], owner_id=3, agent_id=1, api_key_id=None,
                             credits=(50, 50), today=TODAY) == []  # fmt: skip
    assert notice_candidates(budgets=[], owner_id=3, agent_id=1, api_key_id=None,
                             credits=(0, 0), today=TODAY) == []  # fmt: skip


def test_a_month_ends_on_the_first_of_the_next_even_in_december() -> None:
    assert period_bounds("month", date(2026, 12, 31)) == (date(2026, 12, 1), date(2027, 1, 1))
    assert period_bounds("day", date(2026, 12, 31)) == (date(2026, 12, 31), date(2027, 1, 1))


def _candidate(owner_id: int, period_start: date = TODAY):  # type: ignore[no-untyped-def]
    """The one candidate of a spent day budget (the tests set the thresholds to [100])."""
    [found] = notice_candidates(
        budgets=[(Budget("owner", "day", tokens=100), Spent(100))],
        owner_id=owner_id,
        agent_id=1,
        api_key_id=None,
        today=period_start,
    )
    return found


@pytest.mark.django_db
def test_a_notice_is_raised_once_per_threshold_and_period(settings) -> None:
    settings.COST_NOTICE_THRESHOLDS = [100]
    owner = UserFactory()
    notices_seen_reset()
    first = notices_raise([_candidate(owner.pk)])
    assert len(first) == 1
    # Seen by this process: no query; forgotten: the row dedupes.
    assert notices_raise([_candidate(owner.pk)]) == []
    notices_seen_reset()
    assert notices_raise([_candidate(owner.pk)]) == []
    # The next day is a new period.
    assert len(notices_raise([_candidate(owner.pk, date(2026, 2, 15))])) == 1
    assert SpendNotice.objects.filter(owner=owner).count() == 2


@pytest.mark.django_db(transaction=True)
def test_concurrent_steps_that_cross_together_insert_one_notice(settings) -> None:
    settings.COST_NOTICE_THRESHOLDS = [100]
    owner = UserFactory()
    candidate = _candidate(owner.pk)
    threads, results, errors = 8, [], []
    barrier = threading.Barrier(threads)

    def insert() -> None:
        try:
            # Each thread has its own connection; all insert inside open transactions.
            with transaction.atomic():
                barrier.wait(timeout=10)
                results.append(notice_insert(notice=candidate))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connection.close()

    workers = [threading.Thread(target=insert) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(30)

    assert errors == []
    assert len(results) == threads
    assert len([r for r in results if r is not None]) == 1
    assert SpendNotice.objects.filter(owner=owner).count() == 1
