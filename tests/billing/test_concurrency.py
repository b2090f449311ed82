"""50 runs at once, each wanting a 10-point tool, against 100 points: exactly 10 effects.

Real threads, each with its own database connection, run the engine in-process
(message_post + session_run) against the fake model server; a run whose points
are held by in-flight calls steps aside ("waiting") and is run again, as the
sweeper would.
"""

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from typing import Any

import pytest
from django.db import OperationalError, connection
from django.db.models import Sum
from django.test import override_settings

from billing.models import BudgetHold, CreditAccount, CreditLedger, CreditReservation, OwnerBudget
from billing.services import credits_grant, usage_statement
from engine.runner import loop as runner
from record.models import Session, ToolCall, Transition
from sessions.services import message_post
from tests.billing.conftest import call_then_answer
from tests.factories import AgentFactory, SessionFactory, UserFactory
from tests.fakes.model_servers import Call, Recorded, Reply
from tests.row_locks import held_in_transaction

from .rollups import sessions_in_shards, usage_totals, write_usage

pytestmark = pytest.mark.django_db(transaction=True)

RUNS = 50


def _run_one(session_id: str) -> str:
    try:
        message_post(session=Session.objects.get(pk=session_id), content="charge me")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            result = runner.session_run(session_id=session_id)
            if result.stopped == "idle":
                return "idle"
            if result.stopped != "waiting":
                return result.stopped
            time.sleep(0.05)
            Session.objects.filter(pk=session_id).update(lease_expires_at=None)
        return "timeout"
    finally:
        connection.close()


@override_settings(CREDITS_WAIT_S=30)
def test_fifty_runs_against_a_hundred_points_make_exactly_ten_effects(
    paid_agent, openai_server, effects
):
    agent = paid_agent(points=10)
    owner = UserFactory()
    credits_grant(owner_id=owner.pk, points=100, actor="test")
    sessions = [str(SessionFactory(agent=agent, owner=owner).pk) for _ in range(RUNS)]
    openai_server.script(*[call_then_answer] * (2 * RUNS))

    with ThreadPoolExecutor(max_workers=RUNS) as pool:
        outcomes = list(pool.map(_run_one, sessions))

    assert outcomes == ["idle"] * RUNS
    assert effects() == 10
    account = CreditAccount.objects.get(owner=owner)
    assert (account.balance, account.reserved, account.spent_today) == (0, 0, 100)
    ledger = CreditLedger.objects.filter(account=account)
    assert ledger.aggregate(s=Sum("delta"))["s"] == account.balance
    assert ledger.filter(kind="reserve").count() == ledger.filter(kind="settle").count() == 10
    assert min(ledger.values_list("balance_after", flat=True)) >= 0
    calls = ToolCall.objects.filter(session__owner=owner)
    assert calls.filter(status="success").count() == 10
    assert calls.filter(status="rejected", output__code="insufficient_credits").count() == RUNS - 10
    assert not CreditReservation.objects.filter(status__in=["reserved", "waiting"]).exists()
    usage = usage_totals(owner=owner, agent=agent)
    assert (usage.tool_calls, usage.credits_spent, usage.model_calls) == (10, 100, 2 * RUNS)


def test_an_owners_sessions_in_other_shards_do_not_wait_for_a_rollup_row_in_flight():
    """A step holds its session's rollup row until it commits; another session of the
    owner waits for it only if the two share a shard."""
    user, agent = UserFactory(), AgentFactory()
    holder, same_shard, other_shard = sessions_in_shards("A", "A", "B")

    def upsert(session_id: Any) -> None:
        statement = usage_statement(
            owner_id=user.pk, agent_id=agent.pk, session_id=session_id, model_calls=1
        )
        assert statement is not None
        with connection.cursor() as cursor:
            cursor.execute(*statement)

    with held_in_transaction(lambda: upsert(holder)):  # a step in flight
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '1s'")
        try:
            upsert(other_shard)  # its own row: no wait
            with pytest.raises(OperationalError, match="lock timeout"):
                upsert(same_shard)  # the held row: it waits
        finally:
            with connection.cursor() as cursor:
                cursor.execute("RESET lock_timeout")

    assert usage_totals(owner=user, agent=agent).model_calls == 2


def test_concurrent_steps_add_every_call_to_the_keys_spend_row():
    """The spend rollup (per endpoint and key) is an upsert: steps of one key committing at
    once into the same row lose no call, so a key's budget sees all of its spend."""
    from decimal import Decimal

    from django.db import transaction

    from billing.models import SpendDaily
    from billing.services import EndpointSpend, spend_statement

    owner, agent = UserFactory(), AgentFactory()
    threads, steps = 8, 10
    session_id = sessions_in_shards("A")[0]

    def commit_steps() -> None:
        try:
            for _ in range(steps):
                statement = spend_statement(
                    owner_id=owner.pk,
                    agent_id=agent.pk,
                    session_id=session_id,
                    api_key_id=77,
                    calls=[
                        EndpointSpend("m", 10, 5, Decimal("0.001")),
                        EndpointSpend("n", 1, 1, Decimal(0)),
                    ],
                )
                with transaction.atomic(), connection.cursor() as cursor:
                    cursor.execute(*statement)
        finally:
            connection.close()

    with ThreadPoolExecutor(threads) as pool:
        for future in [pool.submit(commit_steps) for _ in range(threads)]:
            future.result(timeout=60)

    rows = SpendDaily.objects.filter(api_key_id=77, endpoint="m")
    assert rows.count() == 1
    totals = rows.aggregate(
        i=Sum("input_tokens"), o=Sum("output_tokens"), c=Sum("cost"), n=Sum("model_calls")
    )
    n = threads * steps
    assert totals == {"i": 10 * n, "o": 5 * n, "c": Decimal("0.001") * n, "n": n}


# --- Budgets under concurrency: a call holds its worst case before it is sent ---------------

# Output at 1.00 per 1,000 tokens, input free: a call's cost is its output tokens / 1000,
# and with an output limit of 100 its worst case is 0.1 (the fake bills all 100).
CALL_COST = Decimal("0.1")


def _priced(endpoint: Any) -> None:
    endpoint.price_input_per_1k = Decimal(0)
    endpoint.price_output_per_1k = Decimal("1.0")
    endpoint.save()


def _spent_today(owner: Any) -> Decimal:
    return usage_totals(owner=owner).cost


def _turn(session_id: str, content: str) -> str:
    try:
        message_post(session=Session.objects.get(pk=session_id), content=content)
        return runner.session_run(session_id=session_id).stopped
    finally:
        connection.close()


@override_settings(BUDGET_OUTPUT_ESTIMATE_TOKENS=100)
def test_thirty_turns_at_once_at_a_day_budgets_boundary_end_within_it(fake_endpoint, openai_server):
    """The owner's day budget has room for 5 calls; 30 turns start at once, each reading
    the same spend. Each call holds its worst case first: 5 run, 25 stop, 100 %."""
    _priced(fake_endpoint)
    owner = UserFactory()
    agent = AgentFactory(model=fake_endpoint)
    OwnerBudget.objects.create(owner=owner, day_cost=Decimal("1.0"))
    write_usage(owner=owner, agent=agent, cost=Decimal("0.5"))
    sessions = [str(SessionFactory(agent=agent, owner=owner).pk) for _ in range(30)]
    # The calls take a while: every turn has read the figures before the first one ends.
    openai_server.script(*[Reply(text="ok", usage=(10, 100), first_delay_s=0.3)] * 30)

    with ThreadPoolExecutor(max_workers=30) as pool:
        outcomes = list(pool.map(lambda s: _turn(s, "hello"), sessions))

    assert outcomes == ["idle"] * 30
    assert _spent_today(owner) <= Decimal("1.0") + CALL_COST
    assert _spent_today(owner) == Decimal("1.0")  # exactly the 5 that fit
    assert len(openai_server.requests) == 5
    assert {r.body["max_tokens"] for r in openai_server.requests} == {100}
    stopped = Transition.objects.filter(
        session__owner=owner, reason__startswith="budget_exceeded"
    ).values_list("reason", flat=True)
    assert list(set(stopped)) == [
        "budget_exceeded: the owner day budget does not cover another model call"
    ]
    assert len(stopped) == 25
    assert not BudgetHold.objects.exists()  # every hold went back with its step's commit


def _fan_out(children: int) -> Callable[[Recorded], Reply]:
    def reply(recorded: Recorded) -> Reply:
        if "fan out" not in recorded.text():
            return Reply(text="part done", usage=(10, 100), first_delay_s=0.3)  # a child
        if recorded.tool_results():
            return Reply(text="all done", usage=(10, 1))
        calls = [Call("agent__helper", {"task": f"part {i}"}) for i in range(children)]
        return Reply(calls=calls, usage=(10, 1))

    return reply


def test_ten_children_at_once_stay_within_the_owners_day_budget(
    fake_endpoint, openai_server, settings
):
    """A parent asks another agent 10 times in one step; the 10 child sessions run at once,
    for the same owner: their calls hold against the owner's budget like any session's,
    so 3 fit (0.651 + 3 x 0.1; 0.049 left is under 64 tokens) and 7 stop."""
    # Both through the fixture: an @override_settings beside it is undone first, and the
    # fixture's teardown then put its value back for every later test of the process.
    settings.BUDGET_OUTPUT_ESTIMATE_TOKENS = 100
    settings.AGENT_MAX_CHILDREN_PER_STEP = 10  # the fan-out, above the default cap
    _priced(fake_endpoint)
    owner = UserFactory()
    AgentFactory(slug="helper", model=fake_endpoint)
    boss = AgentFactory(model=fake_endpoint, tools=["agent.helper"])
    OwnerBudget.objects.create(owner=owner, day_cost=Decimal("1.0"))
    write_usage(owner=owner, agent=boss, cost=Decimal("0.65"))
    parent = SessionFactory(agent=boss, owner=owner)
    openai_server.script(*[_fan_out(10)] * 12)

    assert _turn(str(parent.pk), "fan out") == "waiting"
    children = [str(c.pk) for c in Session.objects.filter(parent=parent)]
    assert len(children) == 10

    def child_run(session_id: str) -> str:
        try:
            return runner.session_run(session_id=session_id).stopped
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=10) as pool:
        assert list(pool.map(child_run, children)) == ["idle"] * 10

    assert _spent_today(owner) <= Decimal("1.0") + CALL_COST
    assert _spent_today(owner) == Decimal("0.951")
    states = Transition.objects.filter(session__parent=parent, reason__startswith="budget_exceeded")
    assert states.count() == 7
    assert not BudgetHold.objects.exists()
