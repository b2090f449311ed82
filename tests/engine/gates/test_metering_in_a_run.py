"""Credits and usage through the engine, in-process (message_post + session_run) against
the fake OpenAI-compatible server: charged once, refused cleanly, rolled up in the step
commit, and never charged twice across a crash after reserve or after dispatch.

`transaction=True`: tools run on helper threads with their own database connections.
"""

import time
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.db import connection
from django.db.models import Sum
from django.utils import timezone

from billing.models import (
    BudgetHold,
    CreditAccount,
    CreditLedger,
    CreditReservation,
    OwnerBudget,
    ToolUsageDaily,
    UsageDaily,
)
from billing.services import credits_grant
from engine.phases import model as model_phase
from engine.phases import tools as tool_phase
from engine.runner import loop as runner
from engine.store import commit
from record.models import Agent, Event, Message, ModelCall, Session, ToolCall
from sessions.services import budget_holds_reconcile, credits_reconcile, message_post
from tests.billing.conftest import always_call, call_then_answer
from tests.factories import AgentFactory, SessionFactory, UserFactory
from tests.fakes.model_servers import Recorded, Reply

pytestmark = pytest.mark.django_db(transaction=True)


class SimulatedCrash(BaseException):
    """Escapes the run loop like a killed process: no error recorded, the lease left to expire."""


def run(session: Session, *, until: float = 20.0) -> Session:
    deadline = time.monotonic() + until
    while True:
        result = runner.session_run(session_id=session.pk)
        if result.stopped == "idle":
            return Session.objects.get(pk=session.pk)
        assert result.stopped == "waiting", result
        assert time.monotonic() < deadline
        time.sleep(0.05)
        Session.objects.filter(pk=session.pk).update(lease_expires_at=None)


def expire_lease(session: Session) -> None:
    Session.objects.filter(pk=session.pk).update(lease_owner=None, lease_expires_at=None)


def assert_books_balance(owner_id: int) -> CreditAccount:
    account = CreditAccount.objects.get(owner_id=owner_id)
    assert account.balance >= 0 and account.reserved >= 0
    assert (
        CreditLedger.objects.filter(account=account).aggregate(s=Sum("delta"))["s"]
        == account.balance
    )
    return account


def turn_finished(session: Session) -> dict:
    event = Event.objects.filter(session=session, type="turn.finished").order_by("-seq").first()
    assert event is not None
    return dict(event.data)


def test_a_paid_call_is_charged_once_and_rolled_up_in_the_step_commit(
    paid_agent, openai_server, effects
):
    agent = paid_agent(points=10)
    owner = UserFactory()
    credits_grant(owner_id=owner.pk, points=100, actor="test")
    session = SessionFactory(agent=agent, owner=owner)
    openai_server.script(call_then_answer, call_then_answer)
    message_post(session=session, content="charge me")
    session = run(session)

    assert effects() == 1
    account = assert_books_balance(owner.pk)
    assert (account.balance, account.reserved, account.spent_today) == (90, 0, 10)
    call = ToolCall.objects.get(session=session)
    assert list(
        CreditLedger.objects.filter(idempotency_key=call.idempotency_key).values_list(
            "kind", flat=True
        )
    ) == ["reserve", "settle"]
    usage = UsageDaily.objects.get(owner=owner, agent=agent)
    calls = ModelCall.objects.filter(session=session)
    assert (usage.model_calls, usage.tool_calls, usage.credits_spent) == (2, 1, 10)
    assert usage.input_tokens == sum(c.input_tokens for c in calls) == session.input_tokens
    assert usage.output_tokens == sum(c.output_tokens for c in calls) == session.output_tokens
    assert usage.cost == sum((c.cost for c in calls), Decimal(0))
    tool = ToolUsageDaily.objects.get(owner=owner, tool="charge")
    assert (tool.calls, tool.failures, tool.credits_spent) == (1, 0, 10)


def test_an_owner_without_an_account_is_not_metered(paid_agent, openai_server, effects):
    session = SessionFactory(agent=paid_agent(points=10), owner=UserFactory())
    openai_server.script(call_then_answer, call_then_answer)
    message_post(session=session, content="charge me")
    run(session)
    assert effects() == 1
    assert not CreditReservation.objects.exists()
    assert UsageDaily.objects.get(owner=session.owner).tool_calls == 1


def test_an_unaffordable_call_does_not_run_and_the_model_is_told_why(
    paid_agent, openai_server, effects
):
    owner = UserFactory()
    credits_grant(owner_id=owner.pk, points=4, actor="test")
    session = SessionFactory(agent=paid_agent(points=10), owner=owner)
    openai_server.script(call_then_answer, call_then_answer)
    message_post(session=session, content="charge me")
    session = run(session)

    assert effects() == 0
    told = openai_server.requests[1].last_tool_result()
    assert "insufficient_credits" in told and "needs 10 points and 4 are left" in told
    call = ToolCall.objects.get(session=session)
    assert (call.status, call.refusal) == ("rejected", "unpaid")
    assert call.output == {"code": "insufficient_credits", "points_needed": 10, "points_left": 4}
    # The model answered, but the call it asked for did not run: the turn is not "ok".
    finished = turn_finished(session)
    assert finished["stop_reason"] == "answer" and finished["outcome"] == "tool_failures"
    assert finished["calls"] == {"ok": 0, "failed": 0, "rejected": 0, "expired": 0, "unpaid": 1}
    # And the model was told plainly, after the result, that the call did not run.
    note = openai_server.requests[1].messages[-1]
    assert note["role"] == "system"
    assert "1 of 1 charge call did NOT run (not enough credit points)" in note["content"]
    assert assert_books_balance(owner.pk).balance == 4


def test_a_model_that_insists_ends_the_turn_with_insufficient_credits(
    paid_agent, openai_server, effects
):
    owner = UserFactory()
    credits_grant(owner_id=owner.pk, points=15, actor="test")
    session = SessionFactory(agent=paid_agent(points=10, max_iterations=8), owner=owner)
    openai_server.script(*[always_call] * 8)
    message_post(session=session, content="charge me again and again")
    session = run(session)

    assert effects() == 1  # the first call was paid for; the next two were refused
    assert session.state == "finished"
    assert turn_finished(session)["stop_reason"] == "insufficient_credits"
    # Ended in the tool step: its calls are counted with those of the earlier steps.
    assert turn_finished(session)["outcome"] == "stopped"
    assert turn_finished(session)["calls"] == {
        "ok": 1, "failed": 0, "rejected": 0, "expired": 0, "unpaid": 2
    }  # fmt: skip
    assert (session.last_turn_outcome, session.last_turn_calls["unpaid"]) == ("stopped", 2)
    partial = Message.objects.filter(session=session, role="assistant").order_by("-seq").first()
    assert "needs 10 credit points and only 5 are left" in partial.content
    assert len(openai_server.requests) == 3
    assert assert_books_balance(owner.pk).balance == 5


def test_crossing_the_low_water_mark_is_an_event(paid_agent, openai_server, effects):
    owner = UserFactory()
    credits_grant(owner_id=owner.pk, points=100, actor="test")
    CreditAccount.objects.filter(owner=owner).update(low_water_mark=95)
    session = SessionFactory(agent=paid_agent(points=10), owner=owner)
    openai_server.script(call_then_answer, call_then_answer)
    message_post(session=session, content="charge me")
    session = run(session)
    low = Event.objects.filter(session=session, type="progress", data__kind="credits.low")
    assert [e.data["balance"] for e in low] == [90]


@pytest.mark.parametrize("crash_at", ["after_reserve", "after_dispatch"])
def test_a_crash_never_charges_twice(paid_agent, openai_server, effects, monkeypatch, crash_at):
    owner = UserFactory()
    credits_grant(owner_id=owner.pk, points=100, actor="test")
    session = SessionFactory(agent=paid_agent(points=10), owner=owner)
    openai_server.script(call_then_answer, call_then_answer)
    crashed = []
    if crash_at == "after_reserve":
        real = tool_phase.calls_dispatched

        def mark(*args, **kwargs):
            if not crashed:
                crashed.append(True)
                raise SimulatedCrash
            return real(*args, **kwargs)

        monkeypatch.setattr(tool_phase, "calls_dispatched", mark)
    else:

        def fault(name: str) -> None:
            if name == "before_tool_results_commit" and not crashed:
                crashed.append(True)
                raise SimulatedCrash

        monkeypatch.setattr(tool_phase, "fault_point", fault)
    message_post(session=session, content="charge me")
    with pytest.raises(SimulatedCrash):
        runner.session_run(session_id=session.pk)
    account = CreditAccount.objects.get(owner=owner)
    assert (account.balance, account.reserved) == (90, 10)  # reserved before the crash
    assert effects() == (1 if crash_at == "after_dispatch" else 0)

    expire_lease(session)  # the sweeper's takeover
    session = run(session)
    assert session.state == "finished"
    assert effects() == 1
    account = assert_books_balance(owner.pk)
    assert (account.balance, account.reserved) == (90, 0)
    assert CreditLedger.objects.filter(kind="reserve").count() == 1
    assert CreditLedger.objects.filter(kind="settle").count() == 1
    assert UsageDaily.objects.get(owner=owner).credits_spent == 10


def test_the_sweeper_closes_reservations_an_ended_turn_left_open(
    paid_agent, openai_server, effects, monkeypatch
):
    owner = UserFactory()
    credits_grant(owner_id=owner.pk, points=100, actor="test")
    session = SessionFactory(agent=paid_agent(points=10), owner=owner)
    openai_server.script(call_then_answer)

    def crash(*args, **kwargs):
        raise SimulatedCrash

    monkeypatch.setattr(tool_phase, "calls_dispatched", crash)
    message_post(session=session, content="charge me")
    with pytest.raises(SimulatedCrash):
        runner.session_run(session_id=session.pk)
    # An operator cancels the stuck turn: its call closes as rejected, its points stay held...
    from sessions.services import session_cancel

    expire_lease(session)
    session_cancel(session=Session.objects.get(pk=session.pk), reason="stop", actor="ops")
    runner.session_run(session_id=session.pk)
    assert ToolCall.objects.get(session=session).status == "rejected"
    assert CreditAccount.objects.get(owner=owner).reserved == 10
    # ...until the sweeper reconciles them from the call's final status.
    assert credits_reconcile(older_than_s=0) == 1
    assert credits_reconcile(older_than_s=0) == 0
    account = assert_books_balance(owner.pk)
    assert (account.balance, account.reserved, account.spent_today) == (100, 0, 0)


def answer_only(recorded: Recorded) -> Reply:
    return Reply(text="the answer", usage=(10, 5))


@pytest.fixture
def paid_model(paid_agent, fake_endpoint):
    """An agent whose model costs one point per token (15 points for the fake's 10 + 5)."""
    fake_endpoint.credits_per_1k_tokens = Decimal(1000)
    fake_endpoint.save(update_fields=["credits_per_1k_tokens"])
    return paid_agent(points=10)


def test_a_model_call_is_charged_for_its_tokens_in_the_step_commit(paid_model, openai_server):
    owner = UserFactory()
    credits_grant(owner_id=owner.pk, points=1000, actor="test")
    session = SessionFactory(agent=paid_model, owner=owner)
    openai_server.script(answer_only)
    message_post(session=session, content="hello")
    session = run(session)

    assert turn_finished(session)["stop_reason"] == "answer"
    account = assert_books_balance(owner.pk)
    assert (account.balance, account.spent_today) == (985, 15)
    charge = CreditLedger.objects.get(kind="charge")
    assert (charge.points, charge.session_id, charge.agent_id) == (15, session.pk, paid_model.pk)
    call = ModelCall.objects.get(session=session)
    assert charge.idempotency_key == f"model:{session.pk}:{call.step}:0"
    assert UsageDaily.objects.get(owner=owner).credits_spent == 15


def test_a_crash_after_the_step_commit_does_not_charge_the_model_call_again(
    paid_model, openai_server, monkeypatch, effects
):
    owner = UserFactory()
    credits_grant(owner_id=owner.pk, points=1000, actor="test")
    session = SessionFactory(agent=paid_model, owner=owner)
    openai_server.script(call_then_answer, call_then_answer, call_then_answer)
    crashed = []

    def fault(name: str) -> None:
        if name == "after_commit_before_publish" and not crashed:
            crashed.append(True)
            raise SimulatedCrash

    message_post(session=session, content="charge me")
    monkeypatch.setattr(commit, "fault_point", fault)
    with pytest.raises(SimulatedCrash):
        runner.session_run(session_id=session.pk)
    assert CreditLedger.objects.filter(kind="charge").count() == 1  # committed with the step

    expire_lease(session)  # the sweeper's takeover re-runs from the committed step
    session = run(session)
    assert session.state == "finished"
    assert effects() == 1
    calls = ModelCall.objects.filter(session=session).count()
    assert calls == 2  # the tool-calling step and the answer
    assert CreditLedger.objects.filter(kind="charge").count() == calls
    account = assert_books_balance(owner.pk)
    assert account.balance == 1000 - 10 - 15 * calls  # the tool's 10 and 15 per model call


def test_a_model_call_the_account_cannot_cover_is_not_sent(paid_model, openai_server):
    owner = UserFactory()
    credits_grant(owner_id=owner.pk, points=100, actor="test")  # the estimate is > 512 points
    session = SessionFactory(agent=paid_model, owner=owner)
    openai_server.script(answer_only)
    message_post(session=session, content="hello")
    session = run(session)

    assert not openai_server.requests
    finished = turn_finished(session)
    assert finished["stop_reason"] == "insufficient_credits"
    partial = Message.objects.filter(session=session, role="assistant").get()
    assert "credit points ran out" in partial.content and "100 left" in partial.content
    assert not ModelCall.objects.filter(session=session).exists()
    assert assert_books_balance(owner.pk).balance == 100


def test_model_calls_of_an_owner_without_an_account_are_not_metered_unless_required(
    paid_model, openai_server, settings
):
    session = SessionFactory(agent=paid_model)
    openai_server.script(answer_only)
    message_post(session=session, content="hello")
    assert turn_finished(run(session))["stop_reason"] == "answer"
    assert not CreditAccount.objects.exists() and not CreditLedger.objects.exists()

    settings.CREDITS_REQUIRED = True
    required = SessionFactory(agent=paid_model)
    message_post(session=required, content="hello")
    assert turn_finished(run(required))["stop_reason"] == "insufficient_credits"
    assert len(openai_server.requests) == 1


# --- Budget holds: a model call's worst case, held from before the call to its commit -------


@pytest.fixture
def budgeted(fake_endpoint, settings) -> Agent:
    """An owner's day budget of 0.15 and calls whose worst case is 0.1: output at 1.00 per
    1,000 tokens (input free), 100 tokens at most."""
    settings.BUDGET_OUTPUT_ESTIMATE_TOKENS = 100
    fake_endpoint.price_input_per_1k = Decimal(0)
    fake_endpoint.price_output_per_1k = Decimal("1.0")
    fake_endpoint.save()
    return AgentFactory(model=fake_endpoint)


def _owner_budget(cost: str) -> Any:
    owner = UserFactory()
    OwnerBudget.objects.create(owner=owner, day_cost=Decimal(cost))
    return owner


def test_a_steps_commit_gives_back_its_budget_hold_keeping_what_the_call_cost(
    budgeted, openai_server
):
    owner = _owner_budget("0.15")
    first, second = (SessionFactory(agent=budgeted, owner=owner) for _ in range(2))
    seen: list[list[tuple[Any, Decimal]]] = []

    def answer(recorded: Recorded) -> Reply:
        seen.append(list(BudgetHold.objects.values_list("session_id", "cost")))
        connection.close()  # the server's thread
        return Reply(text="ok", usage=(10, 10))  # 0.01 of the 0.1 held

    openai_server.script(answer, answer)
    message_post(session=first, content="hello")
    run(first)
    assert seen == [[(first.pk, Decimal("0.1"))]]  # held while the call ran
    assert not BudgetHold.objects.exists()  # given back by the step's commit
    assert UsageDaily.objects.get(owner=owner).cost == Decimal("0.01")

    # 0.01 spent + 0.1 held fits 0.15: the unused 0.09 is free again.
    message_post(session=second, content="hello")
    assert turn_finished(run(second))["stop_reason"] == "answer"
    assert seen[1] == [(second.pk, Decimal("0.1"))]
    assert UsageDaily.objects.filter(owner=owner).aggregate(c=Sum("cost"))["c"] == Decimal("0.02")


def _crash_before_the_call(monkeypatch: pytest.MonkeyPatch, session: Session) -> BudgetHold:
    crashed: list[bool] = []

    def fault(name: str) -> None:
        if name == "before_model_call" and not crashed:
            crashed.append(True)
            raise SimulatedCrash

    monkeypatch.setattr(model_phase, "fault_point", fault)
    message_post(session=session, content="hello")
    with pytest.raises(SimulatedCrash):
        runner.session_run(session_id=session.pk)
    return BudgetHold.objects.get(session_id=session.pk)


def test_the_takeover_of_a_crashed_run_replaces_its_sessions_budget_hold(
    budgeted, openai_server, monkeypatch
):
    owner = _owner_budget("0.15")
    session = SessionFactory(agent=budgeted, owner=owner)
    crashed = _crash_before_the_call(monkeypatch, session)
    assert crashed.cost == Decimal("0.1") and crashed.run  # held by the run that died
    other = SessionFactory(agent=budgeted, owner=owner)
    openai_server.script(Reply(text="ok", usage=(10, 100)), Reply(text="ok", usage=(10, 100)))

    # While it may still be in flight, the dead run's hold counts for the owner's others.
    message_post(session=other, content="hello")
    assert turn_finished(run(other))["stop_reason"] == "budget_exceeded"

    # The run that takes the session over holds for itself in place of the dead one's.
    expire_lease(session)
    assert turn_finished(run(session))["stop_reason"] == "answer"
    assert not BudgetHold.objects.exists()
    assert UsageDaily.objects.get(owner=owner).cost == Decimal("0.1")


def test_the_sweeper_releases_the_budget_hold_of_a_run_that_died(
    budgeted, openai_server, monkeypatch
):
    owner = _owner_budget("0.15")
    session = SessionFactory(agent=budgeted, owner=owner)
    _crash_before_the_call(monkeypatch, session)
    Session.objects.filter(pk=session.pk).update(
        lease_expires_at=timezone.now() + timedelta(seconds=60)
    )
    assert budget_holds_reconcile(lease_grace_s=0) == 0  # its lease still runs: kept

    expire_lease(session)  # the worker is gone
    assert budget_holds_reconcile(lease_grace_s=0) == 1
    assert not BudgetHold.objects.exists()
    other = SessionFactory(agent=budgeted, owner=owner)
    openai_server.script(Reply(text="ok", usage=(10, 100)))
    message_post(session=other, content="hello")
    assert turn_finished(run(other))["stop_reason"] == "answer"


def test_a_hold_past_its_time_stops_counting(budgeted, openai_server, monkeypatch):
    owner = _owner_budget("0.15")
    session = SessionFactory(agent=budgeted, owner=owner)
    _crash_before_the_call(monkeypatch, session)
    BudgetHold.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    other = SessionFactory(agent=budgeted, owner=owner)
    openai_server.script(Reply(text="ok", usage=(10, 100)))

    message_post(session=other, content="hello")
    assert turn_finished(run(other))["stop_reason"] == "answer"
    assert not BudgetHold.objects.filter(session_id=session.pk).exists()  # deleted on the way
