"""Spend per day over a period, stacked by model endpoint or by agent: the cost page's
time series, a named read of the daily rollups (never the raw model calls).

By agent it reads UsageDaily (per owner, agent and day); by model it reads SpendDaily
(per day, endpoint and key). Every day of the period is in the series, a day without
spend as zero, so the chart draws a trend; the biggest series are kept apart and the
rest summed as "other".
"""

from dataclasses import dataclass
from datetime import date, timedelta
from decimal import Decimal

from django.db import connection

from record.models import Agent

from .models import SpendDaily, UsageDaily

STACKS = ("model", "agent")
RANGES = (7, 30, 90)
# Series drawn apart; the rest are one "other" band (a legend stays readable).
MAX_SERIES = 8
OTHER = "other"


@dataclass(frozen=True)
class Series:
    label: str
    values: list[Decimal]  # one per day of the period

    @property
    def total(self) -> Decimal:
        return sum(self.values, start=Decimal(0))


@dataclass(frozen=True)
class SpendSeries:
    stack: str
    days: list[date]
    series: list[Series]  # biggest first, "other" last

    @property
    def day_totals(self) -> list[Decimal]:
        return [
            sum((s.values[i] for s in self.series), start=Decimal(0)) for i in range(len(self.days))
        ]

    @property
    def total(self) -> Decimal:
        return sum((s.total for s in self.series), start=Decimal(0))


def spend_series(
    *, stack: str, start: date, end: date, max_series: int = MAX_SERIES
) -> SpendSeries:
    """Cost per day over [start, end] (days inclusive), one series per model endpoint
    (`stack="model"`) or per agent (`"agent"`).

    1. One grouped query over the period's rollups (day, key, sum of cost).
    2. Series ranked by their total; the first `max_series - 1` kept, the others summed
       into "other" (when there are more than `max_series`).
    3. Every day of the period filled, zero where nothing was spent."""
    if start > end:
        start, end = end, start
    days = [start + timedelta(days=i) for i in range((end - start).days + 1)]
    if stack == "agent":
        table, key = UsageDaily._meta.db_table, "agent_id"
    else:
        stack, table, key = "model", SpendDaily._meta.db_table, "endpoint"
    with connection.cursor() as cursor:
        cursor.execute(
            # SQL names from model metadata (constants); every value is a bound parameter.
            f"""SELECT day, {key}, sum(cost) FROM "{table}"
                 WHERE day BETWEEN %s AND %s GROUP BY day, {key}""",  # nosec B608
            [start, end],
        )
        rows = cursor.fetchall()
    index = {day: i for i, day in enumerate(days)}
    per_key: dict[object, list[Decimal]] = {}
    for day, k, cost in rows:
        per_key.setdefault(k, [Decimal(0)] * len(days))[index[day]] += Decimal(cost)
    ranked = sorted(per_key.items(), key=lambda kv: (-sum(kv[1]), str(kv[0])))
    labels = _labels(stack, [k for k, _ in ranked])
    if len(ranked) > max_series:
        kept, rest = ranked[: max_series - 1], ranked[max_series - 1 :]
        other = [sum((v[i] for _, v in rest), start=Decimal(0)) for i in range(len(days))]
        series = [Series(labels.get(k, str(k)), v) for k, v in kept] + [Series(OTHER, other)]
    else:
        series = [Series(labels.get(k, str(k)), v) for k, v in ranked]
    return SpendSeries(stack=stack, days=days, series=series)


def _labels(stack: str, keys: list[object]) -> dict[object, str]:
    if stack != "agent":
        return {k: str(k) for k in keys}
    ids = [k for k in keys if isinstance(k, int)]
    return dict(Agent.objects.filter(pk__in=ids).values_list("pk", "slug"))
