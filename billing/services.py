"""Writes to credit accounts and usage rollups.

Balances change only through guarded UPDATEs (`... WHERE balance >= %s`) whose
row count says whether they happened, each with its ledger row in the same
transaction; a reservation, its settlement and its release are keyed by the
tool call's idempotency key (a unique ledger index per kind and key), so a
re-run after a crash can never charge twice.

The engine calls these with plain values (owner id, agent id, session id,
points, keys): billing never imports sessions. The settle, release and rollup
writes come as SQL statements the engine adds to its step transaction (one
round trip, no second commit); each carries the step's `guard` so it writes
only if the step's own UPDATE matched.
"""

import json
import logging
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import date
from decimal import Decimal
from functools import partial
from typing import Any, Literal
from uuid import UUID

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from audit.models import AuditAction
from audit.services import audit_record

from .budgets import Budget, CallEstimate, Spent
from .models import (
    BudgetHold,
    CreditAccount,
    CreditLedger,
    CreditPool,
    CreditReservation,
    LedgerKind,
    PoolRequest,
    ReservationStatus,
    SpendDaily,
    SpendNotice,
    ToolUsageDaily,
    UsageDaily,
)
from .notices import NoticeCandidate

Statement = tuple[str, list[Any]]
logger = logging.getLogger(__name__)

_ACCOUNT = CreditAccount._meta.db_table
_LEDGER = CreditLedger._meta.db_table
_RESERVATION = CreditReservation._meta.db_table
_USAGE = UsageDaily._meta.db_table
_TOOL_USAGE = ToolUsageDaily._meta.db_table
_SPEND = SpendDaily._meta.db_table
_HOLD = BudgetHold._meta.db_table
_POOL = CreditPool._meta.db_table
_POOL_REQUEST = PoolRequest._meta.db_table

# The owner's day, on the database clock: the same for every process.
_TODAY = "(now() AT TIME ZONE %s)::date"
# The rollup row a session writes (billing/models.py UsageDaily; migration 0008).
_SHARD = "billing_rollup_shard(%s::uuid)"
_SPENT_TODAY = f"(CASE WHEN spent_day = {_TODAY} THEN spent_today ELSE 0 END)"


class CreditError(Exception):
    """A grant or adjustment that cannot be made (unknown user, balance would go negative)."""


def _tz() -> str:
    return str(settings.BILLING_TIME_ZONE)


# --- Operators: grants and adjustments ----------------------------------------------


def account_ensure(*, owner_id: int) -> CreditAccount:
    account, _ = CreditAccount.objects.get_or_create(owner_id=owner_id)
    return account


def credits_grant(
    *,
    owner_id: int,
    points: int,
    actor: str,
    daily_cap: int | None = None,
    set_daily_cap: bool = False,
    note: str = "",
) -> CreditAccount:
    """Add points to the owner's account (creating it), and optionally set its daily cap."""
    if points < 0:
        raise CreditError("a grant cannot be negative; use an adjustment")
    with transaction.atomic():
        before = account_ensure(owner_id=owner_id)
        account = _balance_change(
            owner_id=owner_id,
            delta=points,
            kind=LedgerKind.GRANT,
            actor=actor,
            note=note,
            daily_cap=daily_cap,
            set_daily_cap=set_daily_cap,
        )
        _credits_audit(
            AuditAction.CREDITS_GRANT, before, account, actor=actor, note=note, delta=points
        )
        return account


def credits_adjust(*, owner_id: int, delta: int, actor: str, note: str = "") -> CreditAccount:
    """Correct a balance up or down (never below zero)."""
    with transaction.atomic():
        before = account_ensure(owner_id=owner_id)
        account = _balance_change(
            owner_id=owner_id, delta=delta, kind=LedgerKind.ADJUST, actor=actor, note=note
        )
        _credits_audit(
            AuditAction.CREDITS_ADJUST, before, account, actor=actor, note=note, delta=delta
        )
        return account


def account_settings_update(
    *,
    owner_id: int,
    daily_cap: int | None,
    low_water_mark: int | None = None,
    actor: str = "",
) -> CreditAccount:
    with transaction.atomic():
        account = account_ensure(owner_id=owner_id)
        before = CreditAccount.objects.get(pk=account.pk)
        fields = {"daily_cap": daily_cap}
        if low_water_mark is not None:
            fields["low_water_mark"] = low_water_mark
        CreditAccount.objects.filter(pk=account.pk).update(**fields)
        account.refresh_from_db()
        if actor:
            _credits_audit(AuditAction.CREDITS_SETTINGS, before, account, actor=actor)
        return account


AUDITED_ACCOUNT_FIELDS = ("balance", "daily_cap", "low_water_mark")


def _credits_audit(
    action: AuditAction,
    before: CreditAccount,
    after: CreditAccount,
    *,
    actor: str,
    note: str = "",
    delta: int = 0,
) -> None:
    """A grant's, an adjustment's or a settings change's audit entry, in its transaction."""
    old = {f: getattr(before, f) for f in AUDITED_ACCOUNT_FIELDS}
    new = {f: getattr(after, f) for f in AUDITED_ACCOUNT_FIELDS}
    # What the guarded UPDATE moved from (calls may have reserved points meanwhile).
    old["balance"] = after.balance - delta
    changed = [f for f in AUDITED_ACCOUNT_FIELDS if old[f] != new[f]]
    if action == AuditAction.CREDITS_SETTINGS and not changed:
        return
    audit_record(
        action=action,
        actor=actor,
        object_type=CreditAccount._meta.label_lower,
        object_id=after.pk,
        object_repr=after.owner.get_username(),
        owner_id=after.owner_id,
        before={f: old[f] for f in changed},
        after={f: new[f] for f in changed},
        reason=note,
        data={"points": delta} if delta else {},
    )


def _balance_change(
    *,
    owner_id: int,
    delta: int,
    kind: LedgerKind,
    actor: str,
    note: str,
    daily_cap: int | None = None,
    set_daily_cap: bool = False,
) -> CreditAccount:
    cap_sql = ", daily_cap = %s" if set_daily_cap else ""
    params: list[Any] = [delta]
    if set_daily_cap:
        params.append(daily_cap)
    params += [owner_id, -delta]
    with connection.cursor() as cursor:
        cursor.execute(
            # SQL names from model metadata (constants); every value is a bound parameter.
            f"""UPDATE {_ACCOUNT} SET balance = balance + %s, updated_at = now(){cap_sql}
                 WHERE owner_id = %s AND balance >= %s RETURNING id, balance""",  # nosec B608
            params,
        )
        row = cursor.fetchone()
    if row is None:
        raise CreditError("the balance cannot go below zero")
    CreditLedger.objects.create(
        account_id=row[0],
        kind=kind,
        points=abs(delta),
        delta=delta,
        balance_after=row[1],
        actor=actor[:150],
        note=note[:500],
    )
    return CreditAccount.objects.get(pk=row[0])


# --- A tool call's points -------------------------------------------------------------


@dataclass(frozen=True)
class Reservation:
    """What `credit_reserve` decided.

    `reserved`: the points are held (now, or by an earlier run of the same call);
    `unmetered`: the owner has no account and credits are not required;
    `insufficient`: the call must not run (`points_left` says what is free);
    `wait`: the points are held by in-flight calls that may still release them:
    try again shortly (until `CREDITS_WAIT_S` after the first try)."""

    outcome: Literal["reserved", "unmetered", "insufficient", "wait"]
    points: int
    points_left: int = 0
    reason: str = ""  # for `insufficient`: balance | daily_cap | no_account
    balance: int = 0
    low_water_crossed: bool = False
    low_water_mark: int = 0


def credit_reserve_statement(
    *,
    owner_id: int,
    idempotency_key: str,
    points: int,
    session_id: UUID | str | None,
    agent_id: int,
    tool: str,
    value: float = 1.0,
    wait_s: float | None = None,
) -> Statement:
    """One statement that holds a call's points before it runs; idempotent per key.
    Its row is the decision (`reservation_of`); a tool step sends its paid calls'
    statements in one batch.

    The work is the PL/pgSQL function `billing_credit_reserve` (migration 0006):
    1. An existing reservation of this key wins (a re-run after a crash).
    2. One guarded UPDATE takes the points if the balance and the daily cap
       allow and no waiting call of higher value per point is ahead; then the
       reservation and its ledger row.
    3. Otherwise: a call that only in-flight reservations stand in the way of
       waits (a `waiting` row, served by value per point); any other is refused.
    """
    wait_s = settings.CREDITS_WAIT_S if wait_s is None else wait_s
    return (
        "SELECT * FROM billing_credit_reserve(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
        [
            owner_id,
            idempotency_key,
            points,
            session_id,
            agent_id,
            tool[:100],
            float(value) / points,  # value per point: waiters are served highest first
            _tz(),
            float(wait_s),
            bool(settings.CREDITS_REQUIRED),
        ],
    )


def reservation_of(row: Sequence[Any], points: int) -> Reservation:
    """The decision in a `credit_reserve_statement`'s row."""
    outcome, left, reason, balance, low_water = row
    return Reservation(
        outcome,
        points,
        points_left=left,
        reason=reason,
        balance=balance,
        low_water_crossed=outcome == "reserved" and balance < low_water <= balance + points,
        low_water_mark=low_water,
    )


def credit_reserve(
    *,
    owner_id: int,
    idempotency_key: str,
    points: int,
    session_id: UUID | str | None,
    agent_id: int,
    tool: str,
    value: float = 1.0,
    wait_s: float | None = None,
) -> Reservation:
    """Hold a call's points before it runs (`credit_reserve_statement`, on its own)."""
    sql, params = credit_reserve_statement(
        owner_id=owner_id,
        idempotency_key=idempotency_key,
        points=points,
        session_id=session_id,
        agent_id=agent_id,
        tool=tool,
        value=value,
        wait_s=wait_s,
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return reservation_of(cursor.fetchone(), points)


def _array_of(values: Sequence[Any], sql_type: str) -> tuple[str, list[Any]]:
    """An array parameter written as `ARRAY[%s, ...]::type[]`: each element is then a
    scalar, which a step's batch quotes in Python (`record.rows`), where a list
    takes psycopg's array dumper (~13 µs a list, a third of a paid model step's
    binding)."""
    return f"ARRAY[{', '.join(['%s'] * len(values))}]::{sql_type}[]", list(values)


def credits_close_statement(
    *, keys: Sequence[str], settle: bool, guard: str = "", actor: str = ""
) -> Statement | None:
    """One statement that settles (the call ran) or releases (it did not) the
    reservations of these keys still open, with their ledger rows, the
    account's counters and the `credits_spent` rollups. Reservations already
    closed are left alone, so running it twice changes nothing."""
    if not keys:
        return None
    tz = _tz()
    key_array, key_params = _array_of(keys, "varchar")
    status = ReservationStatus.SETTLED if settle else ReservationStatus.RELEASED
    kind = LedgerKind.SETTLE if settle else LedgerKind.RELEASE
    where_guard = f" AND {guard}" if guard else ""
    if settle:
        account_set = "reserved = c.reserved - t.p"
        delta = "0"
    else:
        # Given back: free again, and no longer counted against today's cap.
        account_set = (
            "reserved = c.reserved - t.p, balance = c.balance + t.p, "
            f"spent_today = CASE WHEN c.spent_day = {_TODAY} "
            "THEN GREATEST(c.spent_today - t.p_today, 0) ELSE c.spent_today END"
        )
        delta = "r.points"
    # SQL names from model metadata (constants); every value is a bound parameter.
    sql = f"""WITH r AS (
        UPDATE {_RESERVATION} SET status = %s, finished_at = now()
         WHERE idempotency_key = ANY({key_array}) AND status = 'reserved'{where_guard}
     RETURNING account_id, points, idempotency_key, session_id, agent_id, tool, created_at),
    t AS (
        SELECT account_id, sum(points)::bigint AS p,
               sum(CASE WHEN (created_at AT TIME ZONE %s)::date = {_TODAY} THEN points ELSE 0 END)::bigint AS p_today
          FROM r GROUP BY account_id),
    a AS (
        UPDATE {_ACCOUNT} c SET {account_set}, updated_at = now()
          FROM t WHERE c.id = t.account_id
     RETURNING c.id, c.balance, c.owner_id)"""  # nosec B608
    params: list[Any] = [status.value, *key_params, tz, tz]
    if not settle:
        params.append(tz)
    if settle:
        # SQL names from model metadata (constants); every value is a bound parameter.
        sql += f""",
    u AS (
        INSERT INTO {_USAGE} (owner_id, agent_id, day, input_tokens, output_tokens, cost,
                              model_calls, tool_calls, credits_spent, shard)
        SELECT a.owner_id, r.agent_id, {_TODAY}, 0, 0, 0, 0, 0, sum(r.points),
               billing_rollup_shard(r.session_id)
          FROM r JOIN a ON a.id = r.account_id WHERE r.agent_id IS NOT NULL
         GROUP BY a.owner_id, r.agent_id, billing_rollup_shard(r.session_id)
        ON CONFLICT (owner_id, agent_id, day, shard) DO UPDATE
           SET credits_spent = {_USAGE}.credits_spent + EXCLUDED.credits_spent
     RETURNING 1),
    v AS (
        INSERT INTO {_TOOL_USAGE} (tool, owner_id, day, calls, failures, total_ms,
                                   credits_spent, shard)
        SELECT r.tool, a.owner_id, {_TODAY}, 0, 0, 0, sum(r.points),
               billing_rollup_shard(r.session_id)
          FROM r JOIN a ON a.id = r.account_id
         GROUP BY r.tool, a.owner_id, billing_rollup_shard(r.session_id)
        ON CONFLICT (tool, owner_id, day, shard) DO UPDATE
           SET credits_spent = {_TOOL_USAGE}.credits_spent + EXCLUDED.credits_spent
     RETURNING 1)"""  # nosec B608
        params += [tz, tz]
    # SQL names from model metadata (constants); every value is a bound parameter.
    sql += f"""
    INSERT INTO {_LEDGER} (account_id, kind, points, delta, balance_after, idempotency_key,
                           actor, note, session_id, agent_id, tool, created_at)
    SELECT r.account_id, %s, r.points, {delta}, a.balance, r.idempotency_key, %s, '',
           r.session_id, r.agent_id, r.tool, now()
      FROM r JOIN a ON a.id = r.account_id"""  # nosec B608
    params += [kind.value, actor[:150]]
    return sql, params


def credits_close(*, keys: Sequence[str], settle: bool, actor: str = "") -> None:
    """`credits_close_statement` on its own (the sweeper's reconciliation)."""
    statement = credits_close_statement(keys=keys, settle=settle, actor=actor)
    if statement is None:
        return
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(*statement)


def waiting_expire() -> int:
    """Waiting rows past their deadline whose run never came back for them."""
    with connection.cursor() as cursor:
        cursor.execute(
            # SQL names from model metadata (constants); every value is a bound parameter.
            f"UPDATE {_RESERVATION} SET status = 'refused', finished_at = now() "
            "WHERE status = 'waiting' AND wait_until < now() - interval '1 minute'"  # nosec B608
        )
        return cursor.rowcount


# --- Usage rollups ----------------------------------------------------------------------


@dataclass(frozen=True)
class ToolRun:
    tool: str
    failed: bool
    elapsed_ms: int


def usage_statement(
    *,
    owner_id: int,
    agent_id: int,
    session_id: UUID | str | None,
    input_tokens: int = 0,
    output_tokens: int = 0,
    cost: Decimal = Decimal(0),
    model_calls: int = 0,
    tool_calls: int = 0,
    guard: str = "",
) -> Statement | None:
    """Add to the owner's, agent's and day's rollup, in the session's shard (an upsert: no
    lost update under concurrency)."""
    if not (model_calls or tool_calls or input_tokens or output_tokens or cost):
        return None
    where = f" WHERE {guard}" if guard else ""
    return (
        # SQL names from model metadata (constants); every value is a bound parameter.
        f"""INSERT INTO {_USAGE} (owner_id, agent_id, day, input_tokens, output_tokens, cost,
                                  model_calls, tool_calls, credits_spent, shard)
            SELECT %s, %s, {_TODAY}, %s, %s, %s, %s, %s, 0, {_SHARD}{where}
            ON CONFLICT (owner_id, agent_id, day, shard) DO UPDATE SET
                input_tokens = {_USAGE}.input_tokens + EXCLUDED.input_tokens,
                output_tokens = {_USAGE}.output_tokens + EXCLUDED.output_tokens,
                cost = {_USAGE}.cost + EXCLUDED.cost,
                model_calls = {_USAGE}.model_calls + EXCLUDED.model_calls,
                tool_calls = {_USAGE}.tool_calls + EXCLUDED.tool_calls""",  # nosec B608
        [
            owner_id,
            agent_id,
            _tz(),
            input_tokens,
            output_tokens,
            cost,
            model_calls,
            tool_calls,
            session_id,
        ],
    )


def tool_usage_statement(
    *, owner_id: int, session_id: UUID | str | None, runs: Iterable[ToolRun], guard: str = ""
) -> Statement | None:
    """Add calls, failures and time per tool to the owner's day, in the session's shard
    (one multi-row upsert)."""
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for run in runs:
        row = totals[run.tool[:100]]
        row[0] += 1
        row[1] += int(run.failed)
        row[2] += max(run.elapsed_ms, 0)
    if not totals:
        return None
    values = ", ".join(["(%s::varchar, %s::bigint, %s::bigint, %s::bigint)"] * len(totals))
    params: list[Any] = [owner_id, _tz(), session_id]
    # In the rows' key order: concurrent steps lock the rows they share in one order.
    for tool, (calls, failures, ms) in sorted(totals.items()):
        params += [tool, calls, failures, ms]
    where = f" WHERE {guard}" if guard else ""
    return (
        # SQL names from model metadata (constants); every value is a bound parameter.
        f"""INSERT INTO {_TOOL_USAGE} (tool, owner_id, day, calls, failures, total_ms,
                                       credits_spent, shard)
            SELECT v.tool, %s, {_TODAY}, v.calls, v.failures, v.ms, 0, {_SHARD}
              FROM (VALUES {values}) AS v(tool, calls, failures, ms){where}
            ON CONFLICT (tool, owner_id, day, shard) DO UPDATE SET
                calls = {_TOOL_USAGE}.calls + EXCLUDED.calls,
                failures = {_TOOL_USAGE}.failures + EXCLUDED.failures,
                total_ms = {_TOOL_USAGE}.total_ms + EXCLUDED.total_ms""",  # nosec B608
        params,
    )


@dataclass(frozen=True)
class EndpointSpend:
    """One model call's figures for the spend rollup (billing.SpendDaily)."""

    endpoint: str
    input_tokens: int
    output_tokens: int
    cost: Decimal


def spend_statement(
    *,
    owner_id: int,
    agent_id: int,
    session_id: UUID | str | None,
    api_key_id: int | None,
    calls: Iterable[EndpointSpend],
    guard: str = "",
) -> Statement | None:
    """Add a step's model calls to the day's spend per endpoint and API key, in the
    session's shard: one multi-row upsert for the step's batch (no commit of its own)."""
    totals: dict[str, list[Any]] = defaultdict(lambda: [0, 0, Decimal(0), 0])
    for call in calls:
        row = totals[call.endpoint[:100]]
        row[0] += call.input_tokens
        row[1] += call.output_tokens
        row[2] += call.cost
        row[3] += 1
    if not totals:
        return None
    values = ", ".join(
        ["(%s::varchar, %s::bigint, %s::bigint, %s::numeric, %s::bigint)"] * len(totals)
    )
    params: list[Any] = [_tz(), owner_id, agent_id, api_key_id or 0, session_id]
    # In the rows' key order: concurrent steps lock the rows they share in one order.
    for endpoint, (tokens_in, tokens_out, cost, calls_n) in sorted(totals.items()):
        params += [endpoint, tokens_in, tokens_out, cost, calls_n]
    where = f" WHERE {guard}" if guard else ""
    return (
        # SQL names from model metadata (constants); every value is a bound parameter.
        f"""INSERT INTO {_SPEND} (day, owner_id, agent_id, api_key_id, shard, endpoint,
                                  input_tokens, output_tokens, cost, model_calls)
            SELECT {_TODAY}, %s, %s, %s, {_SHARD}, v.endpoint, v.i, v.o, v.c, v.n
              FROM (VALUES {values}) AS v(endpoint, i, o, c, n){where}
            ON CONFLICT (owner_id, day, agent_id, endpoint, api_key_id, shard) DO UPDATE SET
                input_tokens = {_SPEND}.input_tokens + EXCLUDED.input_tokens,
                output_tokens = {_SPEND}.output_tokens + EXCLUDED.output_tokens,
                cost = {_SPEND}.cost + EXCLUDED.cost,
                model_calls = {_SPEND}.model_calls + EXCLUDED.model_calls""",  # nosec B608
        params,
    )


# --- A model call's points ----------------------------------------------------------------


@dataclass(frozen=True)
class ModelCharge:
    """The points one model call's tokens cost, keyed by the call (session, step, position)."""

    idempotency_key: str
    points: int
    note: str = ""


@dataclass(frozen=True)
class UsageFigures:
    """What a step adds to the owner's, agent's and day's rollup row."""

    input_tokens: int = 0
    output_tokens: int = 0
    cost: Decimal = Decimal(0)
    model_calls: int = 0
    tool_calls: int = 0


def model_charge_statement(
    *,
    owner_id: int,
    agent_id: int,
    session_id: UUID | str,
    charges: Sequence[ModelCharge],
    guard: str = "",
    usage: UsageFigures | None = None,
) -> Statement | None:
    """One statement that takes a step's model-call points from the owner's balance, with a
    `charge` ledger row per call and the `credits_spent` rollup, for the step's batch.
    With `usage`, the same upsert of the rollup row adds the step's tokens, cost and calls
    too (written whether or not the owner has an account): the step's only rollup write.

    Charged after the call (the tokens are known only then), so it cannot be refused: if
    concurrent calls left less than the points, the balance goes to zero, never below, and
    the ledger shows what was taken. An owner without an account is not charged. A key
    already in the ledger (the step's calls were charged) makes it change nothing.

    The work is the PL/pgSQL function `billing_model_charge` (migrations 0004, 0005): the
    server keeps its plans per connection (the statement around it is prepared with the
    step's batch, `record.rows.execute_batch`). Its steps:
    1. Lock the owner's account row and read the balance (a concurrent charge is waited
       for, then re-read).
    2. Take the least of the balance and the points: one ledger row per call, in order,
       until that runs out; a key already in the ledger inserts nothing and takes nothing
       (ON CONFLICT on its unique index). Take what the rows took from the balance.
    3. Upsert the day's rollup row with the usage figures and the points taken.
    The arrays are written element by element (`_array_of`)."""
    charges = [c for c in charges if c.points > 0]
    if not charges:
        return None
    where = f" WHERE {guard}" if guard else ""
    figures = usage or UsageFigures()
    keys, key_params = _array_of([c.idempotency_key for c in charges], "varchar")
    points, point_params = _array_of([c.points for c in charges], "bigint")
    notes, note_params = _array_of([c.note[:500] for c in charges], "varchar")
    return (
        f"SELECT billing_model_charge(%s, %s, %s, %s, {keys}, {points}, {notes}, "
        f"%s, %s, %s, %s, %s, %s){where}",
        [
            owner_id,
            agent_id,
            session_id,
            _tz(),
            *key_params,
            *point_params,
            *note_params,
            usage is not None,
            figures.input_tokens,
            figures.output_tokens,
            figures.cost,
            figures.model_calls,
            figures.tool_calls,
        ],
    )


# --- A model call's hold on the shared budgets ----------------------------------------------

# The budgets `billing_budget_reserve` checks, in its result's order.
_HELD_BUDGETS = ("agent day", "owner day", "owner month", "API key")


@dataclass(frozen=True)
class BudgetHeld:
    """What `budget_reserve` decided: `exceeded` names the budget that refused ("" when the
    hold was taken); `spent` is each checked budget's spend plus what the owner's other calls
    in flight hold, read under the owner's lock (by label), for a smaller call to be judged."""

    exceeded: str
    spent: dict[str, Spent]

    @property
    def held(self) -> bool:
        return not self.exceeded


def budget_reserve(
    *,
    owner_id: int,
    agent_id: int,
    api_key_id: int | None,
    session_id: UUID | str,
    run: str,
    call: CallEstimate,
    budgets: Sequence[Budget],
) -> BudgetHeld:
    """Hold a model call's worst case (`call`: its input and output limit at the endpoint's
    prices) against the shared budgets among `budgets` (`Budget.shared`), if it fits them
    all with what the periods spent and the owner's other calls hold: one statement, the
    function `billing_budget_reserve` (migration 0010), its own short transaction. The
    step that records the call deletes the hold in its commit (`budget_release_statement`).
    """
    limits: dict[str, Budget] = {}
    for budget in budgets:
        if budget.shared:
            limits["API key" if budget.who == "API key" else budget.label] = budget
    key = limits.get("API key")
    params: list[Any] = [
        owner_id,
        agent_id,
        api_key_id or 0,
        session_id,
        run[:200],
        _tz(),
        call.tokens,
        call.cost,
        float(settings.BUDGET_HOLD_S),
    ]
    for label in _HELD_BUDGETS[:3]:
        limit = limits.get(label)
        params += [None, None] if limit is None else [limit.tokens, limit.cost]
    params += [None, None, None] if key is None else [key.period, key.tokens, key.cost]
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT * FROM billing_budget_reserve("
            "%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
            params,
        )
        exceeded, *figures = cursor.fetchone()
    spent = {
        (f"API key {key.period}" if label == "API key" and key else label): Spent(
            int(figures[2 * i]), Decimal(figures[2 * i + 1])
        )
        for i, label in enumerate(_HELD_BUDGETS)
    }
    return BudgetHeld(exceeded=exceeded, spent=spent)


def budget_release_statement(*, session_id: UUID | str, guard: str = "") -> Statement:
    """The statement a step's commit runs to give its session's hold back: the call's real
    cost goes into the rollups in the same transaction, so a reserver never sees neither."""
    where = f" AND {guard}" if guard else ""
    # SQL names from model metadata (constants); every value is a bound parameter.
    return (f"DELETE FROM {_HOLD} WHERE session_id = %s{where}", [session_id])  # nosec B608


def budget_holds_sweep(*, session_table: str, lease_grace_s: float) -> int:
    """Delete the holds no run will release: past `expires_at` (BUDGET_HOLD_S), or whose
    session's lease is no longer the holding run's (the run crashed or was taken over) for
    `lease_grace_s`. `session_table` is the engine's (billing never imports sessions)."""
    with connection.cursor() as cursor:
        cursor.execute(
            # SQL names from model metadata (constants); every value is a bound parameter.
            f"""DELETE FROM {_HOLD} h
                 WHERE h.expires_at <= now()
                    OR (h.created_at < now() - make_interval(secs => %s)
                        AND NOT EXISTS (
                            SELECT 1 FROM "{session_table}" s
                             WHERE s.id = h.session_id AND s.lease_owner = h.run
                               AND s.lease_expires_at > now() - make_interval(secs => %s)))""",  # nosec B608
            [lease_grace_s, lease_grace_s],
        )
        return cursor.rowcount


# --- Credit pools: points borrowed by calls in flight, granted by value / cost --------------


@dataclass(frozen=True)
class PoolGrant:
    """What `billing_pool_grant` decided for a request.

    `granted`: its points are the pool's until its results commit (now, or earlier: a step
    run again); `wait`: queued, its session parks until `pool_dispatch` grants it;
    `unpooled`: no enabled pool applies to the owner; `too_big`: its cost is more than the
    pool's size, it can never be granted; `refused`: it waited and its turn ended."""

    outcome: Literal["granted", "wait", "unpooled", "too_big", "refused"]
    pool_id: int | None
    roi: float
    size: int = 0
    in_use: int = 0


def pool_grant_statement(
    *,
    owner_id: int,
    key: str,
    session_id: UUID | str,
    action: str,
    value: float,
    cost: int,
    note: str = "",
) -> Statement:
    """One statement deciding one request (migration 0011, `billing_pool_grant`): idempotent
    per `key`; `value` >= 0 and `cost` > 0 (the gate's estimates, checked there)."""
    return (
        "SELECT * FROM billing_pool_grant(%s, %s, %s, %s, %s, %s, %s)",
        [owner_id, key[:200], session_id, action[:200], float(value), int(cost), note[:500]],
    )


def pool_grant_of(row: Sequence[Any]) -> PoolGrant:
    outcome, pool_id, roi, size, in_use = row
    return PoolGrant(outcome, pool_id, roi, size, in_use)


def pool_release_statement(*, session_id: UUID | str, guard: str = "") -> Statement:
    """Give back the points of the session's granted requests (its step's results commit:
    one step at a time per session, so those are the calls that just ran)."""
    where_guard = f" AND {guard}" if guard else ""
    # SQL names from model metadata (constants); every value is a bound parameter.
    sql = f"""WITH r AS (
        UPDATE {_POOL_REQUEST} SET status = 'released', finished_at = now()
         WHERE session_id = %s AND status = 'granted'{where_guard}
     RETURNING pool_id, cost)
    UPDATE {_POOL} p SET in_use = GREATEST(p.in_use - t.c, 0), updated_at = now()
      FROM (SELECT pool_id, sum(cost)::bigint AS c FROM r GROUP BY pool_id) t
     WHERE p.id = t.pool_id"""  # nosec B608
    return sql, [session_id]


def pool_dispatch(*, pool_id: int) -> list[str]:
    """Grant the pool's waiting requests, highest value / cost first, while they fit; the
    sessions granted (to wake). Its own short transaction."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT session_id FROM billing_pool_dispatch(%s)", [pool_id])
        return [str(row[0]) for row in cursor.fetchall()]


def pool_requests_close(*, session_table: str, parked: str, holding: Sequence[str]) -> int:
    """The sweeper's reconciliation: refuse waiting requests whose session no longer waits
    for them (its turn ended or moved on), and release granted ones whose session is in none
    of the `holding` states (its turn ended before its results' commit: a cancel, a crash).
    `session_table` and the states are the engine's (billing never imports sessions)."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            # SQL names from model metadata (constants); every value is a bound parameter.
            f"""UPDATE {_POOL_REQUEST} r SET status = 'refused', finished_at = now()
                 WHERE r.status = 'waiting'
                   AND NOT EXISTS (SELECT 1 FROM "{session_table}" s
                                    WHERE s.id = r.session_id AND s.state = ANY(%s))""",  # nosec B608
            [[parked, *holding]],
        )
        refused = cursor.rowcount
        cursor.execute(
            # SQL names from model metadata (constants); every value is a bound parameter.
            f"""WITH r AS (
                UPDATE {_POOL_REQUEST} r SET status = 'released', finished_at = now()
                 WHERE r.status = 'granted'
                   AND NOT EXISTS (SELECT 1 FROM "{session_table}" s
                                    WHERE s.id = r.session_id AND s.state = ANY(%s))
             RETURNING pool_id, cost)
            UPDATE {_POOL} p SET in_use = GREATEST(p.in_use - t.c, 0), updated_at = now()
              FROM (SELECT pool_id, sum(cost)::bigint AS c FROM r GROUP BY pool_id) t
             WHERE p.id = t.pool_id""",  # nosec B608
            [[parked, *holding]],
        )
        return refused + cursor.rowcount


# --- Cost notices (billing/notices.py) ------------------------------------------------------

# Crossings this process already saw inserted (or found), so a step after a crossing
# costs no query. Cleared when it grows past this (the row still dedupes).
_SEEN_MAX = 50_000
_seen: set[tuple[str, int, date]] = set()


def notices_raise(candidates: Iterable[NoticeCandidate]) -> list[int]:
    """Insert the notices not raised yet in their period; returns the new rows' ids.

    1. A crossing this process saw already is skipped (no query).
    2. `notice_insert`: under concurrency exactly one inserter gets the id back.
    3. The inserter logs it and, after its commit, queues the webhook (if configured)."""
    new: list[int] = []
    for notice in candidates:
        seen_key = (notice.subject, notice.threshold, notice.period_start)
        if seen_key in _seen:
            continue
        notice_id = notice_insert(notice=notice)
        if len(_seen) > _SEEN_MAX:
            _seen.clear()
        _seen.add(seen_key)
        if notice_id is None:
            continue
        new.append(notice_id)
        logger.warning(
            "cost notice: %s",
            notice.message,
            extra={"notice_id": notice_id, "subject": notice.subject},
        )
        if settings.COST_NOTICE_WEBHOOK_URL:
            transaction.on_commit(partial(_webhook_enqueue, notice_id))
    return new


def notice_insert(*, notice: NoticeCandidate) -> int | None:
    """One INSERT ... ON CONFLICT DO NOTHING on (subject, threshold, period_start): the new
    row's id, or None if the notice of this threshold and period exists (race-safe: the
    unique index decides, not a read before the write)."""
    with connection.cursor() as cursor:
        cursor.execute(
            # SQL names from model metadata (constants); every value is a bound parameter.
            f"""INSERT INTO "{SpendNotice._meta.db_table}"
                    (kind, subject, threshold, period_start, period_end, owner_id, message,
                     data, created_at, dismissed_by, webhook_status)
                VALUES (%s, %s, %s, %s, %s, %s, %s, %s::jsonb, now(), '', '')
                ON CONFLICT (subject, threshold, period_start) DO NOTHING
                RETURNING id""",  # nosec B608
            [
                notice.kind,
                notice.subject[:100],
                notice.threshold,
                notice.period_start,
                notice.period_end,
                notice.owner_id,
                notice.message[:300],
                json.dumps(notice.data, default=str),
            ],
        )
        row = cursor.fetchone()
    return None if row is None else int(row[0])


def _webhook_enqueue(notice_id: int) -> None:
    # Imported here: the task module imports this one.
    from .tasks import notice_webhook_send  # noqa: PLC0415

    try:
        notice_webhook_send.delay(notice_id)
    except Exception:  # noqa: BLE001 - the broker down must not fail a step; the row and the banner stay
        logger.warning("cost notice %s: could not enqueue its webhook", notice_id, exc_info=True)


def notices_seen_reset() -> None:
    """Forget what this process saw (tests; a period's rows were deleted by hand)."""
    _seen.clear()


def notice_dismiss(*, notice_id: int, actor: str) -> bool:
    """An operator hides a notice's banner before its period ends (recorded in the audit
    trail). False if it was dismissed already."""
    with transaction.atomic():
        changed = SpendNotice.objects.filter(pk=notice_id, dismissed_at__isnull=True).update(
            dismissed_at=timezone.now(), dismissed_by=actor[:150]
        )
        if changed:
            notice = SpendNotice.objects.get(pk=notice_id)
            audit_record(
                action=AuditAction.ADMIN_CHANGE,
                actor=actor,
                object_type=SpendNotice._meta.label_lower,
                object_id=notice.pk,
                object_repr=notice.message[:200],
                owner_id=notice.owner_id,
                before={"dismissed": False},
                after={"dismissed": True},
            )
    return bool(changed)


def notice_payload(*, notice_id: int) -> dict[str, Any] | None:
    """The webhook's JSON body for a notice (None if it is gone)."""
    notice = SpendNotice.objects.filter(pk=notice_id).first()
    if notice is None:
        return None
    return {
        "type": "cost.notice",
        "id": notice.pk,
        "kind": notice.kind,
        "subject": notice.subject,
        "threshold": notice.threshold,
        "period_start": notice.period_start.isoformat(),
        "period_end": notice.period_end.isoformat(),
        "owner_id": notice.owner_id,
        "message": notice.message,
        "data": notice.data,
        "created_at": notice.created_at.isoformat(),
    }


def notice_webhook_record(*, notice_id: int, status: str, sent: bool) -> None:
    """What the last delivery attempt got, shown in the notices' admin list."""
    fields: dict[str, Any] = {"webhook_status": status[:200]}
    if sent:
        fields["webhook_sent_at"] = timezone.now()
    SpendNotice.objects.filter(pk=notice_id).update(**fields)
