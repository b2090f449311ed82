"""Spend per day as a time series (billing/series.py): every day of the range, zero days
included, stacked by model endpoint (SpendDaily) or by agent (UsageDaily)."""

from datetime import date, timedelta
from decimal import Decimal

import pytest

from billing.series import OTHER, spend_series
from tests.factories import AgentFactory, SpendDailyFactory, UsageDailyFactory, UserFactory

pytestmark = pytest.mark.django_db

END = date(2026, 3, 31)


def test_every_day_of_the_range_is_in_the_series_zero_days_as_zero() -> None:
    owner = UserFactory()
    SpendDailyFactory(owner=owner, day=END, endpoint="big", cost=Decimal("2.5"))
    SpendDailyFactory(owner=owner, day=END - timedelta(days=3), endpoint="big", cost=Decimal(1))
    SpendDailyFactory(owner=owner, day=END - timedelta(days=7), endpoint="big", cost=Decimal(9))

    data = spend_series(stack="model", start=END - timedelta(days=6), end=END)

    assert data.days == [END - timedelta(days=i) for i in range(6, -1, -1)]
    [series] = data.series
    assert series.label == "big"
    # The day outside the range is left out; days without spend are zeros, not gaps.
    assert series.values == [0, 0, 0, Decimal(1), 0, 0, Decimal("2.5")]
    assert data.total == Decimal("3.5")


@pytest.mark.parametrize("days", [7, 30, 90])
def test_the_ranges_have_as_many_days(days: int) -> None:
    data = spend_series(stack="model", start=END - timedelta(days=days - 1), end=END)
    assert len(data.days) == days and data.days[-1] == END
    assert data.series == [] and data.total == 0


def test_stacked_by_model_the_series_sum_to_each_days_total() -> None:
    owner = UserFactory()
    agent = AgentFactory()
    # Rows of several shards, owners and keys of one endpoint and day are one value.
    for shard, key in ((0, 0), (3, 0), (0, 7)):
        SpendDailyFactory(
            owner=owner, agent_id=agent.pk, day=END, endpoint="a", cost=Decimal(1),
            shard=shard, api_key_id=key,
        )  # fmt: skip
    SpendDailyFactory(day=END, endpoint="b", cost=Decimal("0.5"))
    SpendDailyFactory(day=END - timedelta(days=1), endpoint="b", cost=Decimal(2))

    data = spend_series(stack="model", start=END - timedelta(days=1), end=END)

    by_label = {s.label: s.values for s in data.series}
    assert by_label == {"a": [0, Decimal(3)], "b": [Decimal(2), Decimal("0.5")]}
    assert [s.label for s in data.series] == ["a", "b"]  # biggest total first
    assert data.day_totals == [Decimal(2), Decimal("3.5")]


def test_stacked_by_agent_it_reads_the_usage_rollups_named_by_slug() -> None:
    support, reports = AgentFactory(slug="support"), AgentFactory(slug="reports")
    UsageDailyFactory(agent=support, day=END, cost=Decimal(4))
    UsageDailyFactory(agent=support, day=END, cost=Decimal(1), shard=5)
    UsageDailyFactory(agent=reports, day=END - timedelta(days=2), cost=Decimal(2))

    data = spend_series(stack="agent", start=END - timedelta(days=2), end=END)

    assert [(s.label, s.values) for s in data.series] == [
        ("support", [0, 0, Decimal(5)]),
        ("reports", [Decimal(2), 0, 0]),
    ]


def test_past_the_series_limit_the_smallest_are_summed_as_other() -> None:
    for i in range(5):
        SpendDailyFactory(day=END, endpoint=f"m{i}", cost=Decimal(10 - i))

    data = spend_series(stack="model", start=END, end=END, max_series=3)

    assert [(s.label, s.values) for s in data.series] == [
        ("m0", [Decimal(10)]),
        ("m1", [Decimal(9)]),
        (OTHER, [Decimal(8 + 7 + 6)]),
    ]
    assert data.total == Decimal(40)
