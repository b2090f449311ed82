"""Credit accounts: grants, reservations, settlements, releases, daily caps and rollups."""

import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Sum
from django.test import override_settings

from billing.budgets import Budget, CallEstimate, Spent
from billing.models import (
    BudgetHold,
    CreditAccount,
    CreditLedger,
    CreditReservation,
    ToolUsageDaily,
    UsageDaily,
)
from billing.selectors import credits_cover
from billing.services import (
    CreditError,
    ModelCharge,
    ToolRun,
    budget_release_statement,
    budget_reserve,
    credit_reserve,
    credits_adjust,
    credits_close,
    credits_grant,
    model_charge_statement,
    tool_usage_statement,
    usage_statement,
)
from tests.factories import AgentFactory, SpendDailyFactory, UsageDailyFactory, UserFactory

from .rollups import rollup_shard, sessions_in_shards, usage_totals

pytestmark = pytest.mark.django_db


def reserve(owner_id: int, key: str, points: int = 10, agent_id: int = 0, **kwargs):
    return credit_reserve(
        owner_id=owner_id,
        idempotency_key=key,
        points=points,
        session_id=uuid.uuid4(),
        agent_id=agent_id,
        tool="coupon",
        **kwargs,
    )


def assert_ledger_matches(account: CreditAccount) -> None:
    account.refresh_from_db()
    rows = CreditLedger.objects.filter(account=account)
    assert (rows.aggregate(s=Sum("delta"))["s"] or 0) == account.balance
    held = sum(
        r.points if r.kind == "reserve" else -r.points
        for r in rows.filter(kind__in=["reserve", "settle", "release"])
    )
    assert held == account.reserved
    assert account.balance >= 0 and account.reserved >= 0


def set_clock(when: datetime) -> None:
    """Pin the transaction's now() (the database clock every billing day comes from)."""
    # now() is the transaction's start: only a fresh transaction can move it, so
    # the tests move the clock by faking it with a search_path'd function.
    with connection.cursor() as cursor:
        cursor.execute("CREATE SCHEMA IF NOT EXISTS fakeclock")
        cursor.execute(
            "CREATE OR REPLACE FUNCTION fakeclock.now() RETURNS timestamptz "
            f"LANGUAGE sql AS $$ SELECT '{when.isoformat()}'::timestamptz $$"
        )
        cursor.execute("SET search_path = fakeclock, pg_catalog, public")


def test_grant_creates_the_account_and_writes_the_ledger():
    user = UserFactory()
    account = credits_grant(
        owner_id=user.pk, points=100, actor="ops", daily_cap=50, set_daily_cap=True
    )
    assert (account.balance, account.daily_cap) == (100, 50)
    entry = CreditLedger.objects.get(account=account)
    assert (entry.kind, entry.delta, entry.balance_after, entry.actor) == ("grant", 100, 100, "ops")


def test_an_adjustment_never_takes_the_balance_below_zero():
    user = UserFactory()
    credits_grant(owner_id=user.pk, points=30, actor="ops")
    with pytest.raises(CreditError):
        credits_adjust(owner_id=user.pk, delta=-31, actor="ops")
    account = credits_adjust(owner_id=user.pk, delta=-30, actor="ops", note="refund")
    assert account.balance == 0
    assert_ledger_matches(account)


def test_the_database_refuses_a_negative_balance_even_without_the_guard():
    user = UserFactory()
    credits_grant(owner_id=user.pk, points=5, actor="ops")
    with pytest.raises(IntegrityError), transaction.atomic():
        CreditAccount.objects.filter(owner_id=user.pk).update(balance=-1)


def test_reserve_settle_moves_points_to_spent_once():
    user, agent = UserFactory(), AgentFactory()
    credits_grant(owner_id=user.pk, points=100, actor="ops")
    first = reserve(user.pk, "k1", agent_id=agent.pk)
    again = reserve(user.pk, "k1", agent_id=agent.pk)  # a re-run after a crash
    assert (first.outcome, first.points_left, again.outcome) == ("reserved", 90, "reserved")
    account = CreditAccount.objects.get(owner=user)
    assert (account.balance, account.reserved, account.spent_today) == (90, 10, 10)
    credits_close(keys=["k1"], settle=True)
    credits_close(keys=["k1"], settle=True)  # twice: no second charge
    account.refresh_from_db()
    assert (account.balance, account.reserved) == (90, 0)
    assert CreditReservation.objects.get(idempotency_key="k1").status == "settled"
    assert CreditLedger.objects.filter(idempotency_key="k1").count() == 2
    usage = UsageDaily.objects.get(owner=user, agent=agent)
    assert usage.credits_spent == 10
    assert ToolUsageDaily.objects.get(owner=user, tool="coupon").credits_spent == 10
    assert_ledger_matches(account)


def test_release_gives_the_points_back_and_uncounts_them_from_today():
    user, agent = UserFactory(), AgentFactory()
    credits_grant(owner_id=user.pk, points=100, actor="ops")
    reserve(user.pk, "k1", points=40, agent_id=agent.pk)
    credits_close(keys=["k1"], settle=False)
    credits_close(keys=["k1"], settle=True)  # closed already: nothing happens
    account = CreditAccount.objects.get(owner=user)
    assert (account.balance, account.reserved, account.spent_today) == (100, 0, 0)
    assert not UsageDaily.objects.filter(owner=user).exists()
    assert_ledger_matches(account)


def test_the_ledger_refuses_a_second_settlement_of_one_key():
    user = UserFactory()
    account = credits_grant(owner_id=user.pk, points=10, actor="ops")
    CreditLedger.objects.create(
        account=account, kind="settle", points=1, delta=0, balance_after=10, idempotency_key="x"
    )
    with pytest.raises(IntegrityError), transaction.atomic():
        CreditLedger.objects.create(
            account=account, kind="settle", points=1, delta=0, balance_after=10, idempotency_key="x"
        )


def test_an_unaffordable_call_is_refused_with_what_is_left():
    user, agent = UserFactory(), AgentFactory()
    credits_grant(owner_id=user.pk, points=25, actor="ops")
    refused = reserve(user.pk, "k1", points=30, agent_id=agent.pk)
    assert (refused.outcome, refused.points, refused.points_left) == ("insufficient", 30, 25)
    account = CreditAccount.objects.get(owner=user)
    assert (account.balance, account.reserved) == (25, 0)
    assert_ledger_matches(account)


def test_a_call_only_in_flight_points_stand_in_the_way_of_waits_then_gives_up():
    user, agent = UserFactory(), AgentFactory()
    credits_grant(owner_id=user.pk, points=10, actor="ops")
    assert reserve(user.pk, "a", agent_id=agent.pk).outcome == "reserved"
    waiting = reserve(user.pk, "b", agent_id=agent.pk, wait_s=30)
    assert waiting.outcome == "wait"
    # The in-flight call fails: its points come back and the waiter gets them.
    credits_close(keys=["a"], settle=False)
    assert reserve(user.pk, "b", agent_id=agent.pk).outcome == "reserved"
    # A third waits; the second settles: nothing can come back any more.
    assert reserve(user.pk, "c", agent_id=agent.pk, wait_s=30).outcome == "wait"
    credits_close(keys=["b"], settle=True)
    refused = reserve(user.pk, "c", agent_id=agent.pk)
    assert (refused.outcome, refused.points_left) == ("insufficient", 0)
    assert CreditReservation.objects.get(idempotency_key="c").status == "refused"


def test_a_waiter_past_its_deadline_is_refused():
    user, agent = UserFactory(), AgentFactory()
    credits_grant(owner_id=user.pk, points=10, actor="ops")
    reserve(user.pk, "a", agent_id=agent.pk)
    assert reserve(user.pk, "b", agent_id=agent.pk, wait_s=0).outcome == "wait"
    assert reserve(user.pk, "b", agent_id=agent.pk, wait_s=0).outcome == "insufficient"


def test_waiters_are_served_highest_value_per_point_first():
    user, agent = UserFactory(), AgentFactory()
    credits_grant(owner_id=user.pk, points=10, actor="ops")
    reserve(user.pk, "held", agent_id=agent.pk)
    assert reserve(user.pk, "low", agent_id=agent.pk, value=1, wait_s=30).outcome == "wait"
    assert reserve(user.pk, "high", agent_id=agent.pk, value=5, wait_s=30).outcome == "wait"
    credits_close(keys=["held"], settle=False)
    # The low-value call comes back first but must let the high-value one go ahead.
    assert reserve(user.pk, "low", agent_id=agent.pk, value=1).outcome == "wait"
    assert reserve(user.pk, "high", agent_id=agent.pk, value=5).outcome == "reserved"


def test_no_account_means_unmetered_unless_credits_are_required():
    user = UserFactory()
    assert reserve(user.pk, "k").outcome == "unmetered"
    with override_settings(CREDITS_REQUIRED=True):
        refused = reserve(user.pk, "k2")
    assert (refused.outcome, refused.reason, refused.points_left) == (
        "insufficient",
        "no_account",
        0,
    )


def test_the_daily_cap_refuses_beyond_it_and_resets_at_the_owners_midnight():
    user, agent = UserFactory(), AgentFactory()
    credits_grant(owner_id=user.pk, points=100, actor="ops", daily_cap=20, set_daily_cap=True)
    with override_settings(BILLING_TIME_ZONE="Asia/Shanghai"):
        # 15:30 UTC is 23:30 in Shanghai: the owner's day ends in half an hour.
        set_clock(datetime(2025, 3, 1, 15, 30, tzinfo=UTC))
        assert reserve(user.pk, "d1-a", agent_id=agent.pk).outcome == "reserved"
        assert reserve(user.pk, "d1-b", agent_id=agent.pk).outcome == "reserved"
        capped = reserve(user.pk, "d1-c", agent_id=agent.pk)
        assert (capped.outcome, capped.reason, capped.points_left) == (
            "insufficient",
            "daily_cap",
            0,
        )
        credits_close(keys=["d1-a", "d1-b"], settle=True)
        # 16:10 UTC is already the next day in Shanghai (still 1 March in UTC).
        set_clock(datetime(2025, 3, 1, 16, 10, tzinfo=UTC))
        assert reserve(user.pk, "d2-a", agent_id=agent.pk).outcome == "reserved"
        account = CreditAccount.objects.get(owner=user)
        assert (account.spent_today, str(account.spent_day)) == (10, "2025-03-02")
    assert_ledger_matches(account)


def test_usage_upserts_add_up_per_owner_agent_and_day_over_the_sessions_shards():
    user, agent = UserFactory(), AgentFactory()
    first, again, other = sessions_in_shards("A", "A", "B")
    for session_id in (first, again, other):
        statements = [
            usage_statement(
                owner_id=user.pk,
                agent_id=agent.pk,
                session_id=session_id,
                input_tokens=100,
                output_tokens=20,
                cost=Decimal("0.001500"),
                model_calls=1,
                tool_calls=2,
            ),
            tool_usage_statement(
                owner_id=user.pk,
                session_id=session_id,
                runs=[ToolRun("a", False, 5), ToolRun("a", True, 7), ToolRun("b", False, 1)],
            ),
        ]
        with connection.cursor() as cursor:
            for sql, params in statements:
                cursor.execute(sql, params)
    # One row per shard: the two sessions of one shard share theirs.
    rows = UsageDaily.objects.filter(owner=user, agent=agent)
    assert sorted(r.shard for r in rows) == sorted([rollup_shard(first), rollup_shard(other)])
    usage = rows.aggregate(
        i=Sum("input_tokens"), o=Sum("output_tokens"), c=Sum("cost"), m=Sum("model_calls")
    )
    assert (usage["i"], usage["o"], usage["c"], usage["m"]) == (300, 60, Decimal("0.0045"), 3)
    a = ToolUsageDaily.objects.filter(owner=user, tool="a")
    assert a.count() == 2
    assert a.aggregate(n=Sum("calls"), f=Sum("failures"), ms=Sum("total_ms")) == {
        "n": 6,
        "f": 3,
        "ms": 36,
    }


def test_a_guard_that_does_not_hold_writes_nothing():
    user, agent = UserFactory(), AgentFactory()
    sql, params = usage_statement(
        owner_id=user.pk, agent_id=agent.pk, session_id=None, model_calls=1, guard="false"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
    assert not UsageDaily.objects.exists()


def charge(owner_id: int, agent_id: int, session_id: uuid.UUID, *charges: ModelCharge) -> None:
    statement = model_charge_statement(
        owner_id=owner_id, agent_id=agent_id, session_id=session_id, charges=charges
    )
    assert statement is not None
    with connection.cursor() as cursor:
        cursor.execute(*statement)


def test_a_model_charge_takes_the_points_once_per_call_with_ledger_rows_and_rollup():
    user, agent = UserFactory(), AgentFactory()
    credits_grant(owner_id=user.pk, points=100, actor="test")
    # A session whose rollup row is not shard 0, the column's default.
    session_id = next(s for s in iter(uuid.uuid4, None) if rollup_shard(s) != 0)
    calls = (ModelCharge("model:s:3:0", 7, "a: 700 tokens"), ModelCharge("model:s:3:1", 5))
    charge(user.pk, agent.pk, session_id, *calls)
    charge(user.pk, agent.pk, session_id, *calls)  # the same calls again: already charged

    account = CreditAccount.objects.get(owner=user)
    assert (account.balance, account.reserved, account.spent_today) == (88, 0, 12)
    rows = list(CreditLedger.objects.filter(kind="charge").order_by("id"))
    assert [(r.idempotency_key, r.points, r.delta, r.balance_after) for r in rows] == [
        ("model:s:3:0", 7, -7, 93),
        ("model:s:3:1", 5, -5, 88),
    ]
    assert rows[0].session_id == session_id and rows[0].note == "a: 700 tokens"
    rollup = UsageDaily.objects.get(owner=user, agent=agent)
    assert (rollup.credits_spent, rollup.shard) == (12, rollup_shard(session_id))
    assert_ledger_matches(account)


def test_a_model_charge_beyond_the_balance_takes_it_to_zero_never_below():
    user, agent = UserFactory(), AgentFactory()
    credits_grant(owner_id=user.pk, points=9, actor="test")
    charge(user.pk, agent.pk, uuid.uuid4(), ModelCharge("m:0", 6), ModelCharge("m:1", 6))
    account = CreditAccount.objects.get(owner=user)
    assert account.balance == 0
    rows = CreditLedger.objects.filter(kind="charge").order_by("id")
    assert [(r.points, r.balance_after) for r in rows] == [(6, 3), (3, 0)]
    assert usage_totals(owner=user, agent=agent).credits_spent == 9
    assert_ledger_matches(account)


@pytest.mark.django_db(transaction=True)
def test_concurrent_model_charges_take_exactly_the_balance_between_them():
    """Each charge waits for the other's row lock and takes from the newest balance."""
    user, agent = UserFactory(), AgentFactory()
    credits_grant(owner_id=user.pk, points=50, actor="test")
    start = threading.Barrier(8)

    def one(n: int) -> None:
        try:
            start.wait()
            with transaction.atomic():
                charge(user.pk, agent.pk, uuid.uuid4(), ModelCharge(f"m:{n}", 9))
        finally:
            connection.close()

    threads = [threading.Thread(target=one, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    account = CreditAccount.objects.get(owner=user)
    assert (account.balance, account.spent_today) == (0, 50)
    taken = sorted(CreditLedger.objects.filter(kind="charge").values_list("points", flat=True))
    assert taken == [5, 9, 9, 9, 9, 9]  # 72 asked, 50 taken, never below zero
    assert usage_totals(owner=user, agent=agent).credits_spent == 50
    assert_ledger_matches(account)


def test_a_key_already_charged_takes_nothing_and_the_others_are_charged():
    user, agent = UserFactory(), AgentFactory()
    credits_grant(owner_id=user.pk, points=100, actor="test")
    charge(user.pk, agent.pk, uuid.uuid4(), ModelCharge("m:0", 7))
    charge(user.pk, agent.pk, uuid.uuid4(), ModelCharge("m:0", 7), ModelCharge("m:1", 5))
    account = CreditAccount.objects.get(owner=user)
    assert (account.balance, account.spent_today) == (88, 12)
    rows = CreditLedger.objects.filter(kind="charge").order_by("id")
    assert [(r.idempotency_key, r.points, r.balance_after) for r in rows] == [
        ("m:0", 7, 93),
        ("m:1", 5, 88),
    ]
    assert usage_totals(owner=user, agent=agent).credits_spent == 12
    assert_ledger_matches(account)


@pytest.mark.django_db(transaction=True)
def test_a_key_charged_by_a_transaction_it_waited_for_takes_nothing():
    """Two charges of one key at once: the second waits for the account's lock, then
    finds the key in the ledger and changes nothing (no unique-key error, no second take)."""
    user, agent = UserFactory(), AgentFactory()
    credits_grant(owner_id=user.pk, points=100, actor="test")
    first_charged, second_started = threading.Event(), threading.Event()
    errors: list[BaseException] = []
    second_waited: list[bool] = []

    def first() -> None:
        try:
            with transaction.atomic():
                charge(user.pk, agent.pk, uuid.uuid4(), ModelCharge("m:same", 7))
                first_charged.set()
                second_started.wait(10)
                deadline = time.monotonic() + 10
                # Until the second waits for our lock (its statement may be a prepared
                # one's EXECUTE, so it is found by what it waits on, not by its text).
                with connection.cursor() as cursor:
                    while time.monotonic() < deadline:
                        cursor.execute(
                            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                            " AND datname = current_database() AND pid <> pg_backend_pid()"
                        )
                        if cursor.fetchone()[0]:
                            second_waited.append(True)
                            break
                        time.sleep(0.01)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)
        finally:
            connection.close()

    def second() -> None:
        try:
            first_charged.wait(10)
            second_started.set()
            with transaction.atomic():
                charge(user.pk, agent.pk, uuid.uuid4(), ModelCharge("m:same", 7))
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert second_waited, "the second charge never waited for the first one's lock"
    account = CreditAccount.objects.get(owner=user)
    assert account.balance == 93
    assert CreditLedger.objects.filter(kind="charge").count() == 1
    assert usage_totals(owner=user, agent=agent).credits_spent == 7
    assert_ledger_matches(account)


def test_a_model_charge_without_an_account_or_guard_writes_nothing():
    user, agent = UserFactory(), AgentFactory()
    charge(user.pk, agent.pk, uuid.uuid4(), ModelCharge("m:0", 6))
    assert not CreditLedger.objects.exists() and not UsageDaily.objects.exists()
    credits_grant(owner_id=user.pk, points=10, actor="test")
    sql, params = model_charge_statement(
        owner_id=user.pk,
        agent_id=agent.pk,
        session_id=uuid.uuid4(),
        charges=[ModelCharge("m:1", 6)],
        guard="false",
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
    assert CreditAccount.objects.get(owner=user).balance == 10


def test_credits_cover_checks_the_balance_the_cap_and_a_missing_account():
    user = UserFactory()
    assert credits_cover(owner_id=user.pk, points=5).outcome == "unmetered"
    with override_settings(CREDITS_REQUIRED=True):
        assert credits_cover(owner_id=user.pk, points=5).reason == "no_account"
    credits_grant(owner_id=user.pk, points=10, actor="test", daily_cap=8, set_daily_cap=True)
    assert credits_cover(owner_id=user.pk, points=8).outcome == "ok"
    capped = credits_cover(owner_id=user.pk, points=9)
    assert (capped.outcome, capped.reason, capped.points_left) == ("insufficient", "daily_cap", 8)
    credits_grant(owner_id=user.pk, points=0, actor="test", daily_cap=None, set_daily_cap=True)
    short = credits_cover(owner_id=user.pk, points=11)
    assert (short.outcome, short.reason, short.points_left) == ("insufficient", "balance", 10)


def test_the_ledger_keeps_one_index_per_purpose():
    """Every index is a write on each ledger row: the foreign key's own index would only
    repeat the leading column of `credit_ledger_account` (migration 0004 dropped it)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexdef FROM pg_indexes WHERE tablename = %s ORDER BY indexname",
            [CreditLedger._meta.db_table],
        )
        columns = [row[0].split(" USING btree ")[1] for row in cursor.fetchall()]
    assert columns == [
        "(id)",
        "(account_id, id DESC)",
        "(kind, idempotency_key) WHERE (NOT ((idempotency_key)::text = ''::text))",
    ]


def test_a_charge_keeps_working_after_the_tables_it_writes_change():
    """The function's plans are kept per connection; PostgreSQL re-plans them when a
    table they use changes (a migration adding a column), with no reconnect."""
    user, agent = UserFactory(), AgentFactory()
    credits_grant(owner_id=user.pk, points=100, actor="test")
    charge(user.pk, agent.pk, uuid.uuid4(), ModelCharge("m:before", 4))
    with connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")  # the test's transaction wrote rows
        cursor.execute(f"ALTER TABLE {CreditLedger._meta.db_table} ADD COLUMN extra int")
        cursor.execute("ALTER TABLE billing_usagedaily ALTER COLUMN credits_spent TYPE numeric")
    charge(user.pk, agent.pk, uuid.uuid4(), ModelCharge("m:after", 6))
    assert CreditAccount.objects.get(owner=user).balance == 90
    assert usage_totals(owner=user, agent=agent).credits_spent == 10


def test_a_steps_tool_rollups_lock_their_rows_in_key_order():
    """Two steps sharing tools upsert them in one order, so neither waits on the other's
    second row while holding its first (a deadlock)."""
    runs = [ToolRun("zeta", False, 5), ToolRun("alpha", True, 7), ToolRun("zeta", True, 1)]
    statement = tool_usage_statement(owner_id=1, session_id=None, runs=runs)
    assert statement is not None
    _, params = statement
    assert [p for p in params if p in ("alpha", "zeta")] == ["alpha", "zeta"]
    assert params[3:] == ["alpha", 1, 1, 7, "zeta", 2, 1, 6]


# --- Budget holds (billing_budget_reserve) ---------------------------------------------------


def _today():
    with connection.cursor() as cursor:
        cursor.execute("SELECT (now() AT TIME ZONE %s)::date", [settings.BILLING_TIME_ZONE])
        return cursor.fetchone()[0]


def _hold(owner, agent, budgets, *, key=None, session=None, run="r", output=100):
    return budget_reserve(
        owner_id=owner.pk,
        agent_id=agent.pk,
        api_key_id=key,
        session_id=session or uuid.uuid4(),
        run=run,
        call=CallEstimate(0, output, Decimal(0), Decimal("1.0")),  # 0.1 for 100 tokens
        budgets=budgets,
    )


def test_a_hold_fits_with_the_periods_spend_and_the_owners_other_holds():
    owner, agent = UserFactory(), AgentFactory()
    month = Budget("owner", "month", None, Decimal("0.35"))
    # Spent earlier this month (its first day); last month's spend does not count.
    first = _today().replace(day=1)
    UsageDailyFactory(owner=owner, agent=agent, day=first, cost=Decimal("0.1"))
    UsageDailyFactory(owner=owner, agent=agent, day=first - timedelta(days=1), cost=Decimal(9))

    assert _hold(owner, agent, [month]).held
    assert _hold(owner, agent, [month]).held
    refused = _hold(owner, agent, [month])
    assert refused.exceeded == "owner month"
    assert refused.spent["owner month"] == Spent(200, Decimal("0.3"))  # 0.1 spent, 2 held
    assert _hold(owner, agent, [month], output=50).held  # a smaller call still fits


def test_a_keys_budget_counts_the_keys_spend_and_holds_only():
    owner, agent = UserFactory(), AgentFactory()
    key = Budget("API key", "day", 250, None)
    for key_id, tokens in ((7, 100), (8, 900)):
        SpendDailyFactory(
            owner=owner, day=_today(), agent_id=agent.pk, api_key_id=key_id, input_tokens=tokens
        )

    assert _hold(owner, agent, [key], key=7).held
    assert _hold(owner, agent, [Budget("owner", "day", 10_000, None)], key=9).held  # not key 7's
    refused = _hold(owner, agent, [key], key=7)
    assert (refused.exceeded, refused.spent["API key day"].tokens) == ("API key day", 200)


def test_a_sessions_holds_add_up_within_its_run_and_are_replaced_by_another_run():
    owner, agent = UserFactory(), AgentFactory()
    day = Budget("owner", "day", None, Decimal("0.25"))
    session = uuid.uuid4()
    assert _hold(owner, agent, [day], session=session, run="w1").held
    assert _hold(owner, agent, [day], session=session, run="w1").held
    assert BudgetHold.objects.get(session_id=session).cost == Decimal("0.2")  # one step, two calls
    assert _hold(owner, agent, [day], session=session, run="w1").exceeded == "owner day"

    assert _hold(owner, agent, [day], session=session, run="w2").held  # a takeover
    hold = BudgetHold.objects.get(session_id=session)
    assert (hold.run, hold.cost) == ("w2", Decimal("0.1"))
    release = budget_release_statement(session_id=session)
    with connection.cursor() as cursor:
        cursor.execute(*release)
    assert not BudgetHold.objects.exists()
