"""Named reads of credits and usage."""

import contextlib
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.apps import apps
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection
from django.db.models import Count, DecimalField, F, OuterRef, Subquery, Sum, Value
from django.db.models.functions import Coalesce

from observability.readings import Gauge
from record.models import Agent

from .models import (
    CreditAccount,
    CreditReservation,
    NoticeKind,
    OwnerBudget,
    PoolRequest,
    PoolRequestStatus,
    ReservationStatus,
    SpendDaily,
    SpendNotice,
    UsageDaily,
)
from .notices import billing_today, budget_notice_text, notice_spent_text


@dataclass(frozen=True)
class OwnerUsage:
    balance: int
    reserved: int
    daily_cap: int | None
    spent_today: int
    input_tokens: int
    output_tokens: int
    cost: Decimal


def usage_for_owner(*, owner_id: int) -> OwnerUsage:
    """The owner's credits now and all-time usage (from the daily rollups: a few rows, no raw calls)."""
    with connection.cursor() as cursor:
        cursor.execute(
            # SQL names from model metadata (constants); every value is a bound parameter.
            f"""SELECT balance, reserved, daily_cap,
                       CASE WHEN spent_day = (now() AT TIME ZONE %s)::date THEN spent_today ELSE 0 END
                  FROM {CreditAccount._meta.db_table} WHERE owner_id = %s""",  # nosec B608
            [settings.BILLING_TIME_ZONE, owner_id],
        )
        account = cursor.fetchone() or (0, 0, None, 0)
    totals = UsageDaily.objects.filter(owner_id=owner_id).aggregate(
        input_tokens=Sum("input_tokens"), output_tokens=Sum("output_tokens"), cost=Sum("cost")
    )
    return OwnerUsage(
        balance=account[0],
        reserved=account[1],
        daily_cap=account[2],
        spent_today=account[3],
        input_tokens=totals["input_tokens"] or 0,
        output_tokens=totals["output_tokens"] or 0,
        cost=totals["cost"] or Decimal(0),
    )


def reservations_open(*, older_than_s: float, limit: int = 500) -> list[str]:
    """Keys of reservations still held after `older_than_s`: candidates for reconciliation."""
    with connection.cursor() as cursor:
        cursor.execute(
            # SQL names from model metadata (constants); every value is a bound parameter.
            f"""SELECT idempotency_key FROM {CreditReservation._meta.db_table}
                 WHERE status = %s AND created_at < now() - make_interval(secs => %s)
                 ORDER BY created_at LIMIT %s""",  # nosec B608
            [ReservationStatus.RESERVED.value, older_than_s, limit],
        )
        return [row[0] for row in cursor.fetchall()]


@dataclass(frozen=True)
class CreditsCheck:
    """Whether the owner can pay `points` now: `unmetered` (no account, credits not
    required), `ok`, or `insufficient` with the points left and why (balance | daily_cap
    | no_account)."""

    outcome: str
    points: int
    points_left: int = 0
    reason: str = ""


def credits_cover(*, owner_id: int, points: int) -> CreditsCheck:
    """Can the owner's free balance and today's cap cover `points`? A read, no hold:
    a model call is charged after it ran, for the tokens it used."""
    with connection.cursor() as cursor:
        cursor.execute(
            # SQL names from model metadata (constants); every value is a bound parameter.
            f"""SELECT balance, daily_cap,
                       CASE WHEN spent_day = (now() AT TIME ZONE %s)::date THEN spent_today ELSE 0 END
                  FROM {CreditAccount._meta.db_table} WHERE owner_id = %s""",  # nosec B608
            [settings.BILLING_TIME_ZONE, owner_id],
        )
        row = cursor.fetchone()
    if row is None:
        if settings.CREDITS_REQUIRED:
            return CreditsCheck("insufficient", points, 0, "no_account")
        return CreditsCheck("unmetered", points)
    balance, cap, spent_today = row
    if cap is not None and spent_today + points > cap:
        return CreditsCheck(
            "insufficient", points, max(min(balance, cap - spent_today), 0), "daily_cap"
        )
    if balance < points:
        return CreditsCheck("insufficient", points, balance, "balance")
    return CreditsCheck("ok", points, balance)


def credits_reserved_gauges() -> list[Gauge]:
    """Scrape-time gauge (observability/collector.py): points held by in-flight tool calls."""
    total = CreditAccount.objects.aggregate(n=Sum("reserved"))["n"] or 0
    return [
        Gauge(
            "agent_credits_reserved",
            "Credit points reserved by tool calls in flight, over all accounts.",
            (),
            [((), total)],
        )
    ]


def notices_open(*, limit: int = 10) -> list[SpendNotice]:
    """Cost notices not dismissed whose period still runs (BILLING_TIME_ZONE), newest first."""
    return list(
        SpendNotice.objects.filter(
            dismissed_at__isnull=True, period_end__gt=billing_today()
        ).order_by("-created_at")[:limit]
    )


@dataclass(frozen=True)
class BannerNotice:
    notice: SpendNotice
    text: str


def notices_banner(*, limit: int) -> tuple[list[BannerNotice], int]:
    """The open notices for the admin's banner, and how many more there are: of a budget's
    thresholds in one period only the highest (an "80 %" beside "reached" says nothing),
    each naming the user, key or agent rather than its id (three small queries, by id)."""
    rows = notices_open(limit=limit * 4 + 1)
    top: dict[tuple[str, Any], SpendNotice] = {}
    for notice in rows:
        key = (notice.subject, notice.period_start)
        if key not in top or notice.threshold > top[key].threshold:
            top[key] = notice
    kept = sorted(top.values(), key=lambda n: n.created_at, reverse=True)
    budget = [
        n
        for n in kept[:limit]
        if n.kind == NoticeKind.BUDGET
        and isinstance(n.data, dict)
        and {"who", "id"} <= n.data.keys()
    ]
    ids: dict[str, set[int]] = {"owner": set(), "key": set(), "agent": set()}
    for notice in budget:
        with contextlib.suppress(TypeError, ValueError):
            ids.setdefault(str(notice.data.get("who")), set()).add(int(notice.data["id"]))
    names: dict[str, dict[int, str]] = {}
    user = get_user_model()
    names["owner"] = (
        dict(user.objects.filter(pk__in=ids["owner"]).values_list("pk", user.USERNAME_FIELD))
        if ids["owner"]
        else {}
    )
    # Looked up by name: billing never imports accounts.
    names["key"] = (
        {
            pk: f"{name or prefix + '…'} of {owner}"
            for pk, prefix, name, owner in apps.get_model("accounts", "ApiKey")
            .objects.filter(pk__in=ids["key"])
            .values_list("pk", "prefix", "name", "owner__username")
        }
        if ids["key"]
        else {}
    )
    names["agent"] = (
        dict(Agent.objects.filter(pk__in=ids["agent"]).values_list("pk", "slug"))
        if ids["agent"]
        else {}
    )
    found = []
    for notice in kept[:limit]:
        text = notice.message
        if notice in budget:
            data = notice.data
            who = str(data.get("who"))
            try:
                name = names.get(who, {}).get(int(data["id"]), str(data["id"]))
            except (KeyError, TypeError, ValueError):
                name = "?"
            text = budget_notice_text(
                period=str(data.get("period", "")),
                who=who,
                name=str(name),
                threshold=notice.threshold,
                share=float(data.get("share") or 0),
                spent=notice_spent_text(data),
            )
        found.append(BannerNotice(notice, text))
    return found, max(len(kept) - limit, 0)


@dataclass(frozen=True)
class OwnerDaySpend:
    owner_id: int
    username: str
    spent: Decimal
    limit: Decimal

    @property
    def share(self) -> float:
        return float(self.spent / self.limit) if self.limit else 0.0


def day_budgets_total() -> tuple[Decimal, int]:
    """The owners' day cost budgets added up, and how many there are: the line the cost
    chart draws against the days' spend of every owner (0, 0: nobody has one)."""
    row = OwnerBudget.objects.filter(day_cost__isnull=False, day_cost__gt=0).aggregate(
        total=Sum("day_cost"), n=Count("id")
    )
    return row["total"] or Decimal(0), row["n"]


def spend_today(*, owner_id: int | None, top: int = 5) -> tuple[Decimal, list[OwnerDaySpend]]:
    """Today's model spend (the daily rollups, BILLING_TIME_ZONE's day) and the owners with a
    day cost budget, nearest to it first. `owner_id` None: every owner. Two aggregate queries."""
    today = billing_today()
    rows = SpendDaily.objects.filter(day=today)
    budgets = OwnerBudget.objects.filter(day_cost__isnull=False, day_cost__gt=0)
    if owner_id is not None:
        rows = rows.filter(owner_id=owner_id)
        budgets = budgets.filter(owner_id=owner_id)
    total = rows.aggregate(c=Sum("cost"))["c"] or Decimal(0)
    money = DecimalField(max_digits=20, decimal_places=6)
    spent = (
        SpendDaily.objects.filter(day=today, owner_id=OuterRef("owner_id"))
        .values("owner_id")
        .annotate(c=Sum("cost"))
        .values("c")
    )
    near = (
        budgets.annotate(spent=Coalesce(Subquery(spent, output_field=money), Value(0, money)))
        .annotate(share=F("spent") / F("day_cost"))
        .values_list("owner_id", "owner__username", "spent", "day_cost")
        .order_by("-share", "owner_id")[:top]
    )
    return total, [OwnerDaySpend(o, u, s, d or Decimal(0)) for o, u, s, d in near]


def pools_waiting() -> list[int]:
    """The pools with a waiting request (the sweeper dispatches them)."""
    return list(
        PoolRequest.objects.filter(status=PoolRequestStatus.WAITING)
        .values_list("pool_id", flat=True)
        .distinct()
    )
