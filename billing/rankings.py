"""Cost rankings per user, agent, model endpoint, API key, session or day over a period:
named reads for the admin.

Users, agents and days come from the daily rollups (UsageDaily: per owner, agent and day,
at most 8 rows, one per session shard, summed here), so a ranking costs the same however
many calls the period saw. Model endpoints and API keys come from the spend rollups
(SpendDaily: per day, owner, agent, endpoint and key), which count model calls' tokens
and cost only (tool calls and credit points are per owner and agent). Sessions carry
their own running totals; a session ranks in the period it was created in.
"""

from dataclasses import dataclass
from datetime import date, timedelta
from decimal import Decimal
from typing import Any

from django.apps import apps
from django.contrib.auth import get_user_model
from django.db import connection
from django.db.models import Max
from django.utils import timezone

from record.models import Agent, Session

from .models import SpendDaily, UsageDaily

GROUPS = ("user", "agent", "model", "key", "session", "day")
# Grouped from the spend rollups; their tool calls and credits are not known (None).
SPEND_GROUPS = {"model": "endpoint", "key": "api_key_id"}
SPEND_METRICS = ("cost", "input_tokens", "output_tokens", "model_calls")
METRICS = ("cost", "input_tokens", "output_tokens", "model_calls", "tool_calls", "credits_spent")
_KEY = {"user": "owner_id", "agent": "agent_id", "day": "day"}
# The metric's column in the rollup query below.
_COLUMN = {
    "input_tokens": 2,
    "output_tokens": 3,
    "cost": 4,
    "model_calls": 5,
    "tool_calls": 6,
    "credits_spent": 7,
}


@dataclass(frozen=True)
class RankRow:
    key: str
    label: str
    input_tokens: int
    output_tokens: int
    cost: Decimal
    model_calls: int | None
    tool_calls: int | None
    credits_spent: int | None

    def value(self, metric: str) -> Any:
        return getattr(self, metric)


def _order(order: str) -> tuple[str, bool]:
    metric = order.lstrip("-")
    if metric not in METRICS:
        metric, order = "cost", "-cost"
    return metric, order.startswith("-")


def cost_rankings(
    *, group: str, start: date, end: date, order: str = "-cost", limit: int = 100
) -> list[RankRow]:
    """The top `limit` of `group` over [start, end] (days inclusive), sorted by `order`
    (a metric, `-` first for descending)."""
    metric, descending = _order(order)
    if group == "session":
        return _session_rankings(start, end, metric, descending, limit)
    if group in SPEND_GROUPS:
        return _spend_rankings(group, start, end, metric, descending, limit)
    key = _KEY.get(group, "owner_id")
    direction = "DESC" if descending else "ASC"
    table = UsageDaily._meta.db_table
    sums = """sum(input_tokens), sum(output_tokens), sum(cost), sum(model_calls),
              sum(tool_calls), sum(credits_spent)"""
    if group == "user":
        # Thousands of users, a page of them: two passes over the period's rollups, the top
        # keys by the one sorted metric (one sum per user is most of the work saved), then
        # every sum of those keys alone (through the rollups' owner index). Ties are broken
        # by the key in both, so the rows are exactly those of one pass summing everything.
        # Agents and days are few: one pass is cheaper than two there.
        sql = f"""WITH top AS (
                      SELECT {key} AS k FROM "{table}" WHERE day BETWEEN %s AND %s
                       GROUP BY {key} ORDER BY sum({metric}) {direction}, {key} LIMIT %s)
                  SELECT {key}, {sums} FROM "{table}"
                   WHERE day BETWEEN %s AND %s AND {key} IN (SELECT k FROM top)
                   GROUP BY {key} ORDER BY {_COLUMN[metric]} {direction}, {key}"""  # nosec B608
        params: list[Any] = [start, end, limit, start, end]
    else:
        sql = f"""SELECT {key}, {sums} FROM "{table}" WHERE day BETWEEN %s AND %s
                   GROUP BY {key} ORDER BY {_COLUMN[metric]} {direction}, {key}
                   LIMIT %s"""  # nosec B608
        params = [start, end, limit]
    with connection.cursor() as cursor:
        # SQL names from model metadata (constants); every value is a bound parameter.
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    labels = _labels(group, [r[0] for r in rows])
    return [
        RankRow(
            key=str(r[0]),
            label=labels.get(r[0], str(r[0])),
            input_tokens=int(r[1]),
            output_tokens=int(r[2]),
            cost=Decimal(r[3]),
            model_calls=int(r[4]),
            tool_calls=int(r[5]),
            credits_spent=int(r[6]),
        )
        for r in rows
    ]


def _spend_rankings(
    group: str, start: date, end: date, metric: str, descending: bool, limit: int
) -> list[RankRow]:
    key = SPEND_GROUPS[group]
    metric = metric if metric in SPEND_METRICS else "cost"
    direction = "DESC" if descending else "ASC"
    column = {"input_tokens": 2, "output_tokens": 3, "cost": 4, "model_calls": 5}[metric]
    table = SpendDaily._meta.db_table
    sums = "sum(input_tokens), sum(output_tokens), sum(cost), sum(model_calls)"
    if group == "key":
        # As many keys as users: the two passes of the user ranking (the sorted metric
        # alone for the top keys, then every sum of those through the key's index).
        sql = f"""WITH top AS (
                      SELECT {key} AS k FROM "{table}" WHERE day BETWEEN %s AND %s
                       GROUP BY {key} ORDER BY sum({metric}) {direction}, {key} LIMIT %s)
                  SELECT {key}, {sums} FROM "{table}"
                   WHERE day BETWEEN %s AND %s AND {key} IN (SELECT k FROM top)
                   GROUP BY {key} ORDER BY {column} {direction}, {key}"""  # nosec B608
        params: list[Any] = [start, end, limit, start, end]
    else:
        sql = f"""SELECT {key}, {sums} FROM "{table}" WHERE day BETWEEN %s AND %s
                   GROUP BY {key} ORDER BY {column} {direction}, {key} LIMIT %s"""  # nosec B608
        params = [start, end, limit]
    with connection.cursor() as cursor:
        # SQL names from model metadata (constants); every value is a bound parameter.
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    labels = _labels(group, [r[0] for r in rows])
    return [
        RankRow(
            key=str(r[0]),
            label=labels.get(r[0], str(r[0])),
            input_tokens=int(r[1]),
            output_tokens=int(r[2]),
            cost=Decimal(r[3]),
            model_calls=int(r[4]),
            tool_calls=None,
            credits_spent=None,
        )
        for r in rows
    ]


def degradation_levels(*, group: str, keys: list[str], hours: int = 24) -> dict[str, int]:
    """The highest degradation level among each owner's or agent's sessions active in the
    last `hours` (the level is set at every model step)."""
    if group not in ("user", "agent") or not keys:
        return {}
    column = "owner_id" if group == "user" else "agent_id"
    since = timezone.now() - timedelta(hours=hours)
    rows = (
        Session.objects.filter(**{f"{column}__in": keys}, updated_at__gte=since)
        .values(column)
        .annotate(level=Max("degradation_level"))
    )
    return {str(r[column]): int(r["level"]) for r in rows}


def _labels(group: str, keys: list[Any]) -> dict[Any, str]:
    if group == "agent":
        return dict(Agent.objects.filter(pk__in=keys).values_list("pk", "slug"))
    if group == "day":
        return {k: k.isoformat() for k in keys}
    if group == "model":
        return {k: str(k) for k in keys}
    if group == "key":
        # Looked up by name: billing never imports accounts. 0: sessions opened without a key.
        api_key = apps.get_model("accounts", "ApiKey")
        found = {
            pk: f"{prefix}… {name or ''} ({owner})".replace("  ", " ")
            for pk, prefix, name, owner in api_key.objects.filter(pk__in=keys).values_list(
                "pk", "prefix", "name", "owner__username"
            )
        }
        return {
            k: found.get(k, "no key (admin, command, workflow)" if k == 0 else f"key {k}")
            for k in keys
        }
    user = get_user_model()
    return dict(user.objects.filter(pk__in=keys).values_list("pk", user.USERNAME_FIELD))


def _session_rankings(
    start: date, end: date, metric: str, descending: bool, limit: int
) -> list[RankRow]:
    field = metric if metric in ("cost", "input_tokens", "output_tokens") else "cost"
    rows = (
        Session.objects.filter(created_at__date__gte=start, created_at__date__lte=end)
        .order_by(f"-{field}" if descending else field, "pk")
        .values_list(
            "pk", "owner__username", "agent__slug", "input_tokens", "output_tokens", "cost"
        )
    )[:limit]
    return [
        RankRow(
            key=str(pk),
            label=f"{str(pk)[:8]} ({owner}, {agent})",
            input_tokens=tokens_in,
            output_tokens=tokens_out,
            cost=cost,
            model_calls=None,
            tool_calls=None,
            credits_spent=None,
        )
        for pk, owner, agent, tokens_in, tokens_out, cost in rows
    ]
