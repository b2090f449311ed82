"""A paid model call's credits check: from the gate's figures when they clearly suffice
(no query), from the account row when they are close or this run already spent them."""

from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from billing.budgets import Spent
from billing.models import CreditAccount, CreditLedger, CreditReservation
from billing.pressure import OwnerFigures
from billing.services import credits_grant
from engine.gates.metering import CreditsWait, credits_reserve
from engine.model.credits import INSUFFICIENT, model_credits_check
from llm.types import ChatMessage, ChatRequest
from record.models import ToolCall
from tests.factories import ModelEndpointFactory, ToolFactory
from tools.execution import tools_for_agent

pytestmark = pytest.mark.django_db

REQUEST = ChatRequest(messages=(ChatMessage(role="user", content="hello"),), max_tokens=500)


def _figures(credits: tuple[int, int, int | None, int] | None) -> OwnerFigures:
    return OwnerFigures(
        budgets=[], agent_day=Spent(), turn=Spent(), credits_left=None, credits=credits
    )


@pytest.fixture
def paid(make_session):  # type: ignore[no-untyped-def]
    endpoint = ModelEndpointFactory(name="paid-check", credits_per_1k_tokens=Decimal(100))
    session = make_session()
    credits_grant(owner_id=session.owner_id, points=1000, actor="test")
    return session, endpoint


def _check(session, endpoint, figures, since=0):  # type: ignore[no-untyped-def]
    with CaptureQueriesContext(connection) as captured:
        check = model_credits_check(session, endpoint, REQUEST, 512, figures, since)
    return check, len(captured.captured_queries)


def test_figures_far_from_the_balance_answer_without_a_query(paid) -> None:  # type: ignore[no-untyped-def]
    session, endpoint = paid
    check, queries = _check(session, endpoint, _figures((1000, 0, None, 0)))
    assert (check.outcome, queries) == ("ok", 0)
    assert check.points == 51  # (about 6 + 500 tokens) at 100 points per 1,000, rounded up


def test_what_the_run_spent_since_or_a_near_cap_sends_it_to_the_account(paid) -> None:  # type: ignore[no-untyped-def]
    session, endpoint = paid
    check, queries = _check(session, endpoint, _figures((1000, 0, None, 0)), since=950)
    # The row still has 1,000 (the test charged nothing): the run's count was the worry.
    assert (check.outcome, queries) == ("ok", 1)
    check, queries = _check(session, endpoint, _figures((1000, 0, 100, 40)))
    assert queries == 1
    check, queries = _check(session, endpoint, None)
    assert (check.outcome, queries) == ("ok", 1)


def test_no_account_in_the_figures_is_unmetered_without_a_query(paid, settings) -> None:  # type: ignore[no-untyped-def]
    session, endpoint = paid
    check, queries = _check(session, endpoint, _figures(None))
    assert (check.outcome, queries) == ("unmetered", 0)
    settings.CREDITS_REQUIRED = True
    check, queries = _check(session, endpoint, _figures(None))
    assert (check.outcome, queries) == ("ok", 1)  # required: the row is asked (it exists)


def test_a_steps_paid_calls_are_reserved_in_one_round_trip(make_session) -> None:  # type: ignore[no-untyped-def]
    """Three paid calls and a free one: one statement batch. The balance covers two; the
    third waits for them (they may still be released). The same calls again take nothing
    more; with the two settled-to-spent and a cap, the third is refused with what is left."""
    session = make_session()
    credits_grant(owner_id=session.owner_id, points=25, actor="test")
    paid_tool = ToolFactory.create(credit_cost=10)
    free_tool = ToolFactory.create()
    tools = tools_for_agent([paid_tool.name, free_tool.name])
    calls = [
        ToolCall.objects.create(
            session=session,
            turn=1,
            step=1,
            position=n,
            call_id=f"c{n}",
            tool_name=name,
            input={"n": n},
            idempotency_key=f"{session.pk}:1:1:{n}",
        )
        for n, name in enumerate([paid_tool.name, free_tool.name, paid_tool.name, paid_tool.name])
    ]
    with CaptureQueriesContext(connection) as captured, pytest.raises(CreditsWait):
        credits_reserve(session, calls, tools)
    assert len(captured.captured_queries) == 1
    assert [getattr(c, "credit_points", 0) for c in calls] == [10, 0, 10, 0]
    account = CreditAccount.objects.get(owner_id=session.owner_id)
    assert (account.balance, account.reserved) == (5, 20)
    statuses = dict(CreditReservation.objects.values_list("idempotency_key", "status"))
    assert statuses == {
        calls[0].idempotency_key: "reserved",
        calls[2].idempotency_key: "reserved",
        calls[3].idempotency_key: "waiting",
    }
    # A re-run of the step (after a crash), the day's cap now reached: the held calls
    # stay held and take nothing more; the waiting one is refused with what is left.
    CreditAccount.objects.filter(pk=account.pk).update(daily_cap=20)
    for call in calls:
        call.credit_points = 0  # type: ignore[attr-defined]
    credits = credits_reserve(session, calls, tools)
    assert [getattr(c, "credit_points", 0) for c in calls] == [10, 0, 10, 0]
    assert list(credits.settled) == [calls[3].pk]
    refusal = credits.settled[calls[3].pk].output
    assert (refusal["code"], refusal["points_needed"], refusal["points_left"]) == (
        INSUFFICIENT,
        10,
        0,
    )
    account.refresh_from_db()
    assert (account.balance, account.reserved) == (5, 20)
    assert CreditReservation.objects.get(idempotency_key=calls[3].idempotency_key).status == (
        "refused"
    )
    assert CreditLedger.objects.filter(kind="reserve").count() == 2
