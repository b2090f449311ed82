"""Cost notices: a budget of a day or a month reaching a threshold share of its limit
(COST_NOTICE_THRESHOLDS, percent), or a balance under its low-water mark.

The budget gate hands every model step's budgets and credits to
`billing.services.notices_raise` (no query while nothing new is crossed), which takes
the crossings found here (`notice_candidates`, pure). A crossing inserts one SpendNotice row keyed by
(subject, threshold, period start) with ON CONFLICT DO NOTHING: whichever of concurrent
steps inserts it sends the webhook (after its commit, from a Celery task); the others
insert nothing. The period comes from the day in BILLING_TIME_ZONE, so a new period
raises anew and the banner of the old one goes away by itself.
"""

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

from django.conf import settings

from .budgets import Budget, Spent
from .models import NoticeKind

# Budgets a notice is about: those of a calendar period (a turn or a session budget is
# one run's own limit, which ends the turn, not an operator's concern).
NOTICE_PERIODS = ("day", "month")


@dataclass(frozen=True)
class NoticeCandidate:
    kind: str
    subject: str
    threshold: int
    period_start: date
    period_end: date
    owner_id: int | None
    message: str
    data: dict[str, Any]


def billing_today() -> date:
    return datetime.now(ZoneInfo(str(settings.BILLING_TIME_ZONE))).date()


def period_bounds(period: str, today: date) -> tuple[date, date]:
    """[start, end) of the day or the calendar month holding `today`."""
    if period == "month":
        start = today.replace(day=1)
        end = (start + timedelta(days=32)).replace(day=1)
        return start, end
    return today, today + timedelta(days=1)


def _share(budget: Budget, spent: Spent) -> float:
    share = 0.0
    if budget.tokens:
        share = max(share, spent.tokens / budget.tokens)
    if budget.cost:
        share = max(share, float(spent.cost / budget.cost))
    return share


def notice_candidates(
    *,
    budgets: Iterable[tuple[Budget, Spent]],
    owner_id: int,
    agent_id: int,
    api_key_id: int | None,
    credits: tuple[int, int] | None = None,
    today: date | None = None,
) -> list[NoticeCandidate]:
    """The thresholds these budgets and this balance have reached (no query).

    `credits` is (balance, low-water mark) of the owner's account, if it has one."""
    today = today or billing_today()
    ids = {"owner": owner_id, "agent": agent_id, "API key": api_key_id}
    found = []
    for budget, spent in budgets:
        if budget.period not in NOTICE_PERIODS or (budget.tokens is None and budget.cost is None):
            continue
        who_id = ids.get(budget.who)
        if who_id is None:
            continue
        share = _share(budget, spent)
        start, end = period_bounds(budget.period, today)
        who = "key" if budget.who == "API key" else budget.who
        for threshold in sorted(set(settings.COST_NOTICE_THRESHOLDS)):
            if share * 100 < threshold:
                continue
            found.append(
                NoticeCandidate(
                    kind=NoticeKind.BUDGET,
                    subject=f"{who}:{who_id}:{budget.period}",
                    threshold=threshold,
                    period_start=start,
                    period_end=end,
                    owner_id=owner_id,
                    message=budget_notice_text(
                        period=budget.period,
                        who=who,
                        name=str(who_id),
                        threshold=threshold,
                        share=share,
                        spent=_spent_text(budget, spent),
                    ),
                    data={
                        "who": who,
                        "id": who_id,
                        "period": budget.period,
                        "share": round(share, 4),
                        "spent_tokens": spent.tokens,
                        "spent_cost": str(spent.cost),
                        "limit_tokens": budget.tokens,
                        "limit_cost": None if budget.cost is None else str(budget.cost),
                    },
                )
            )
    if credits is not None:
        balance, low_water = credits
        if low_water and balance < low_water:
            found.append(
                NoticeCandidate(
                    kind=NoticeKind.CREDITS_LOW,
                    subject=f"credits:{owner_id}",
                    threshold=0,
                    period_start=today,
                    period_end=today + timedelta(days=1),
                    owner_id=owner_id,
                    message=f"credit balance of owner {owner_id} is {balance} points, "
                    f"under its low-water mark of {low_water}",
                    data={"balance": balance, "low_water_mark": low_water},
                )
            )
    return found


def budget_notice_text(
    *, period: str, who: str, name: str, threshold: int, share: float, spent: str
) -> str:
    """ "day budget of owner alice: 80 % used (...)" while under the limit; at or past it
    "reached", since the budget gate refuses the owner's turns from then on."""
    where = "reached" if threshold >= 100 or share >= 1 else f"{threshold} % used"
    return f"{period} budget of {who} {name}: {where} ({spent})"


def notice_spent_text(data: dict[str, Any]) -> str:
    """The spent-of-limit text from a budget notice's stored `data`."""
    limit_cost = data.get("limit_cost")
    budget = Budget(
        who=str(data.get("who", "")),
        period=str(data.get("period", "")),
        tokens=data.get("limit_tokens"),
        cost=None if limit_cost is None else Decimal(str(limit_cost)),
    )
    spent = Spent(int(data.get("spent_tokens") or 0), Decimal(str(data.get("spent_cost") or 0)))
    return _spent_text(budget, spent)


def _spent_text(budget: Budget, spent: Spent) -> str:
    parts = []
    if budget.cost is not None:
        # 1.000000 (the column's scale) reads as 1.
        limit = budget.cost.normalize()
        parts.append(f"cost {spent.cost.quantize(Decimal('0.0001'))} of {limit:f}")
    if budget.tokens is not None:
        parts.append(f"{spent.tokens} of {budget.tokens} tokens")
    return ", ".join(parts)
