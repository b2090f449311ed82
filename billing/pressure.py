"""What the engine needs to judge budgets and degradation before a model call, in one
round trip: the owner's budgets, what the owner and the agent spent today, the turn's
spend so far, and the owner's credits against their low-water mark. Plus the two
pressures that live in Redis (the worker queue's depth, and the share of workers over
their health thresholds, each read at most once a second per process)."""

import time
from dataclasses import dataclass
from decimal import Decimal
from uuid import UUID

import redis
from django.conf import settings
from django.db import connection
from kombu.exceptions import KombuError

from runtime import health, tasks

from .budgets import Budget, Spent
from .models import CreditAccount, KeyBudget, OwnerBudget, SpendDaily, UsageDaily

QUEUE_DEPTH_TTL_S = 1.0
_queue_seen: list[float] = [0.0, 0.0]  # read at, depth
# Whether an owner has budgets or a watched credit account, remembered per process this
# long: an owner with neither costs a model step no query (a new budget applies within it).
OWNER_WATCH_TTL_S = 2.0
_watched: dict[int, tuple[float, bool]] = {}


@dataclass(frozen=True)
class OwnerFigures:
    budgets: list[tuple[Budget, Spent]]  # the owner's (agent budgets are added by the caller)
    agent_day: Spent
    turn: Spent
    credits_left: float | None  # balance / low-water mark; None when not watched
    # The owner's credit account (balance, reserved, daily cap, spent today), if there is one:
    # the environment block shows it to the model at no extra query.
    credits: tuple[int, int, int | None, int] | None = None
    low_water_mark: int = 0


# The first day of the month of `_DAY` (both in BILLING_TIME_ZONE).
_DAY = "(now() AT TIME ZONE %s)::date"
_MONTH = f"date_trunc('month', {_DAY})::date"


def _sql(model_call_table: str) -> str:
    """The query of `owner_figures`. A month's and a key's spend are sums of daily rollups
    from the period's first day: a new period starts at zero with nothing to reset. The
    owner's rollups are read once for the month (today's are a FILTER of them); the key's
    only when the key has a budget (a one-time filter otherwise)."""
    # SQL names from model metadata (constants); every value is a bound parameter.
    return f"""
SELECT b.turn_tokens, b.turn_cost, b.session_tokens, b.session_cost, b.day_tokens, b.day_cost,
       c.balance, c.low_water_mark, c.reserved, c.daily_cap,
       CASE WHEN c.spent_day = {_DAY} THEN c.spent_today ELSE 0 END,
       d.agent_tokens, d.agent_cost, d.owner_tokens, d.owner_cost,
       t.tokens, t.cost,
       b.month_tokens, b.month_cost, d.month_tokens, d.month_cost,
       kb.period, kb.tokens, kb.cost, k.tokens, k.cost
  FROM (SELECT coalesce(sum(input_tokens + output_tokens) FILTER (WHERE agent_id = %s AND day = {_DAY}), 0) AS agent_tokens,
               coalesce(sum(cost) FILTER (WHERE agent_id = %s AND day = {_DAY}), 0) AS agent_cost,
               coalesce(sum(input_tokens + output_tokens) FILTER (WHERE day = {_DAY}), 0) AS owner_tokens,
               coalesce(sum(cost) FILTER (WHERE day = {_DAY}), 0) AS owner_cost,
               coalesce(sum(input_tokens + output_tokens), 0) AS month_tokens,
               coalesce(sum(cost), 0) AS month_cost
          FROM "{UsageDaily._meta.db_table}"
         WHERE owner_id = %s AND day >= {_MONTH}) d
  CROSS JOIN (SELECT coalesce(sum(input_tokens + output_tokens), 0) AS tokens,
                     coalesce(sum(cost), 0) AS cost
                FROM "{model_call_table}" WHERE session_id = %s AND turn = %s) t
  LEFT JOIN "{OwnerBudget._meta.db_table}" b ON b.owner_id = %s
  LEFT JOIN "{CreditAccount._meta.db_table}" c ON c.owner_id = %s
  LEFT JOIN "{KeyBudget._meta.db_table}" kb ON kb.api_key_id = %s
  LEFT JOIN LATERAL (
        SELECT coalesce(sum(input_tokens + output_tokens), 0) AS tokens,
               coalesce(sum(cost), 0) AS cost
          FROM "{SpendDaily._meta.db_table}"
         WHERE kb.id IS NOT NULL AND api_key_id = kb.api_key_id
           AND day >= CASE WHEN kb.period = 'month' THEN {_MONTH} ELSE {_DAY} END) k ON true"""  # nosec B608


def owner_watched(*, owner_id: int) -> bool:
    """Does the owner have a budget or a credit account? (Either is read before a model call:
    budgets and the low-water mark judge the call, the account's figures go to the model's
    environment block.)"""
    now = time.monotonic()
    seen = _watched.get(owner_id)
    if seen is not None and now - seen[0] < OWNER_WATCH_TTL_S:
        return seen[1]
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {owner_watch_sql('%s')}", [owner_id] * 3)  # nosec B608
        watched = bool(cursor.fetchone()[0])
    owner_watch_note(owner_id=owner_id, watched=watched, at=now)
    return watched


def owner_watch_sql(owner: str) -> str:
    """`owner_watched`'s question as an SQL expression of the owner's id `owner` (a column,
    or a placeholder: then it takes the id three times). The engine asks it in the round
    trip that takes a run's lease, and tells the answer with `owner_watch_note`."""
    # SQL names from model metadata (constants); the owner is a column or a placeholder.
    return f"""(EXISTS (SELECT 1 FROM "{OwnerBudget._meta.db_table}" WHERE owner_id = {owner})
                OR EXISTS (SELECT 1 FROM "{CreditAccount._meta.db_table}" WHERE owner_id = {owner})
                OR EXISTS (SELECT 1 FROM "{KeyBudget._meta.db_table}" WHERE owner_id = {owner}))"""  # nosec B608


def owner_watch_note(*, owner_id: int, watched: bool, at: float | None = None) -> None:
    """Remember an answer to `owner_watched` read just now (by `owner_watch_sql`)."""
    if len(_watched) > 100_000:
        _watched.clear()
    _watched[owner_id] = (time.monotonic() if at is None else at, watched)


def owner_watch_reset() -> None:
    """Forget what this process remembered (a budget just set here applies at once)."""
    _watched.clear()


def owner_figures(
    *,
    owner_id: int,
    agent_id: int,
    session_id: UUID | str,
    turn: int,
    session_spent: Spent,
    model_call_table: str,
    api_key_id: int | None = None,
) -> OwnerFigures:
    """One query. `model_call_table` is the engine's (billing never imports sessions);
    `api_key_id` is the key that opened the session (its budget, if any, is read too)."""
    tz = str(getattr(settings, "BILLING_TIME_ZONE", settings.TIME_ZONE))
    with connection.cursor() as cursor:
        cursor.execute(
            _sql(model_call_table),
            [
                tz,  # spent_day
                agent_id,
                tz,
                agent_id,
                tz,
                tz,
                tz,
                owner_id,
                tz,  # month start
                session_id,
                turn,
                owner_id,
                owner_id,
                api_key_id or 0,
                tz,
                tz,
            ],
        )
        row = cursor.fetchone()
    (tt, tc, st, sc, dt, dc, balance, low_water, reserved, cap, spent, *rest) = row
    (at, ac, ot, oc, turn_t, turn_c, mt, mc, month_t, month_c, *key) = rest
    key_period, key_tokens, key_cost, key_t, key_c = key
    owner_day = Spent(int(ot), Decimal(oc))
    turn_spent = Spent(int(turn_t), Decimal(turn_c))
    budgets = [
        (Budget("owner", "turn", tt, tc), turn_spent),
        (Budget("owner", "session", st, sc), session_spent),
        (Budget("owner", "day", dt, dc), owner_day),
        (Budget("owner", "month", mt, mc), Spent(int(month_t), Decimal(month_c))),
    ]
    if key_period is not None:
        budgets.append(
            (
                Budget("API key", key_period, key_tokens, key_cost),
                Spent(int(key_t or 0), Decimal(key_c or 0)),
            )
        )
    credits_left = None
    if balance is not None and low_water:
        credits_left = balance / low_water
    return OwnerFigures(
        budgets=budgets,
        agent_day=Spent(int(at), Decimal(ac)),
        turn=turn_spent,
        credits_left=credits_left,
        credits=None if balance is None else (int(balance), int(reserved), cap, int(spent)),
        low_water_mark=int(low_water or 0),
    )


def queue_depth() -> int:
    """Runs waiting in the worker queue, at most one read a second per process."""
    now = time.monotonic()
    if now - _queue_seen[0] < QUEUE_DEPTH_TTL_S:
        return int(_queue_seen[1])
    try:
        depth = tasks.queue_depth()
    except (KombuError, redis.RedisError, OSError):
        depth = 0
    _queue_seen[:] = [now, float(depth)]
    return depth


def worker_pressure() -> float:
    """The share of live workers taking no new runs (runtime/health.py), 0..1."""
    return health.unhealthy_share()
