"""Budgets: the pre-call check (unit) and a budget ending a real turn cleanly (engine)."""

import time
from datetime import timedelta
from decimal import Decimal

import pytest
from django.db.models import Sum

from billing.budgets import (
    MIN_OUTPUT_TOKENS,
    Budget,
    CallEstimate,
    Spent,
    budget_check,
)
from billing.models import KeyBudget, OwnerBudget, SpendDaily, UsageDaily
from billing.notices import billing_today
from billing.pressure import owner_watch_reset, owner_watched
from engine import session_run
from engine.gates.budget import BUDGET_NOTE, partial_answer
from record.models import Event, Message, ModelCall, Session
from sessions.services import message_post
from tests.factories import ToolFactory, api_key_for
from tests.sessions.conftest import make_agent, make_session, owner, rules_model  # noqa: F401


def test_a_call_that_fits_every_budget_runs_unchanged() -> None:
    verdict = budget_check(
        budgets=[(Budget("agent", "turn", tokens=1000), Spent(100))],
        call=CallEstimate(input_tokens=300, output_tokens=500),
    )
    assert verdict.allowed and verdict.max_tokens is None
    assert verdict.used == pytest.approx(0.1)


def test_a_call_whose_output_would_cross_a_budget_is_made_smaller() -> None:
    verdict = budget_check(
        budgets=[(Budget("owner", "day", tokens=1000), Spent(400))],
        call=CallEstimate(input_tokens=300, output_tokens=500),
    )
    assert verdict.allowed and verdict.max_tokens == 300


def test_a_call_the_budget_cannot_cover_is_refused_naming_the_budget() -> None:
    verdict = budget_check(
        budgets=[
            (Budget("agent", "session", tokens=10_000), Spent(0)),
            (Budget("owner", "turn", cost=Decimal("0.01")), Spent(0, Decimal("0.009"))),
        ],
        call=CallEstimate(
            input_tokens=100,
            output_tokens=100,
            price_input_per_1k=Decimal("0.01"),
            price_output_per_1k=Decimal("0.02"),
        ),
    )
    assert not verdict.allowed
    assert verdict.exceeded == Budget("owner", "turn", cost=Decimal("0.01"))
    assert "owner turn budget" in verdict.message


def test_room_below_the_useful_minimum_refuses() -> None:
    verdict = budget_check(
        budgets=[(Budget("agent", "turn", tokens=300 + MIN_OUTPUT_TOKENS - 1), Spent(0))],
        call=CallEstimate(input_tokens=300, output_tokens=500),
    )
    assert not verdict.allowed


def test_no_budgets_means_no_limit() -> None:
    verdict = budget_check(
        budgets=[(Budget("agent", "turn"), Spent(10**9))],
        call=CallEstimate(input_tokens=10**6, output_tokens=10**6),
    )
    assert verdict.allowed and verdict.max_tokens is None


def test_the_partial_answer_is_the_last_assistant_text_of_the_turn() -> None:
    history = [
        Message(turn=1, role="assistant", content="old turn"),
        Message(turn=2, role="user", content="q"),
        Message(turn=2, role="assistant", content="Found 3 orders so far."),
        Message(turn=2, role="tool", content="{}"),
    ]
    assert partial_answer(history, 2).startswith("Found 3 orders so far.")
    assert partial_answer(history[:2], 2) == BUDGET_NOTE


# --- In the engine -------------------------------------------------------------------


def _run(session: Session) -> Session:
    started = time.monotonic()
    assert session_run(session_id=session.pk).stopped == "idle"
    assert time.monotonic() - started < 20
    return Session.objects.get(pk=session.pk)


def _looping_agent(agent_factory, **budgets):
    ToolFactory(name="clock", roles=["support"])
    return agent_factory(
        tools=["clock"],
        max_iterations=8,
        # The final step (max_iterations) offers no tool: the model answers.
        rules=[
            {"when": {"note": "Do not call tools"}, "answer": "Out of steps."},
            {"tool_calls": [{"tool": "clock"}]},
        ],
        **budgets,
    )


@pytest.mark.django_db(transaction=True)
def test_a_turn_budget_ends_the_turn_cleanly_with_budget_exceeded(make_agent, make_session):  # noqa: F811
    # Measure the first call of this loop without a budget, then allow a little more.
    probe = make_session(agent=_looping_agent(make_agent))
    message_post(session=probe, content="loop")
    _run(probe)
    first = ModelCall.objects.filter(session=probe).order_by("id").first()
    # The gate's estimate is above what the model reports: it counts the tool schemas and
    # the environment block's "budget left" line, which the unbudgeted probe has not. 150
    # leaves room for the first call's minimum output and none for the second call's.
    budget = first.input_tokens + 150

    agent = _looping_agent(make_agent, slug="budgeted", budget_turn_tokens=budget)
    session = make_session(agent=agent)
    message_post(session=session, content="loop")
    session = _run(session)

    assert session.state == "finished"
    calls = list(ModelCall.objects.filter(session=session))
    assert len(calls) == 1  # the second call was refused before it was sent
    assert calls[0].input_tokens + calls[0].output_tokens <= budget
    finished = Event.objects.filter(session=session, type="turn.finished").get()
    assert finished.data["stop_reason"] == "budget_exceeded"
    final = Message.objects.filter(session=session, role="assistant").order_by("-seq").first()
    assert final.content == BUDGET_NOTE
    assert session.input_tokens + session.output_tokens <= budget


@pytest.mark.django_db(transaction=True)
def test_an_owner_session_budget_refuses_the_next_turn(make_agent, make_session, owner):  # noqa: F811
    session = make_session(agent=make_agent())
    message_post(session=session, content="hello")
    session = _run(session)
    used = session.input_tokens + session.output_tokens
    assert used > 0
    OwnerBudget.objects.create(owner=owner, session_tokens=used + 10)
    # This process remembered for OWNER_WATCH_TTL_S that the owner had no budget.
    assert owner_watched(owner_id=owner.pk) is False
    owner_watch_reset()

    message_post(session=session, content="hello again")
    session = _run(session)

    assert ModelCall.objects.filter(session=session).count() == 1
    last = Event.objects.filter(session=session, type="turn.finished").order_by("-seq").first()
    assert last.data["stop_reason"] == "budget_exceeded"
    assert "owner session" in session.transitions.order_by("-id").first().reason


# --- Budgets of a calendar month and of an API key ---------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_month_budget_counts_this_months_days(make_agent, make_session, owner):  # noqa: F811
    agent = make_agent()
    today = billing_today()
    OwnerBudget.objects.create(owner=owner, month_tokens=1000)
    # Last month's spend is over the budget on its own: a new month starts at zero.
    UsageDaily.objects.create(
        owner=owner, agent=agent, day=today.replace(day=1) - timedelta(days=1), input_tokens=5000
    )
    owner_watch_reset()
    session = make_session(agent=agent)
    message_post(session=session, content="hello")
    session = _run(session)
    assert ModelCall.objects.filter(session=session).count() == 1

    # This month's earlier spend (any day of it; a shard of its own) leaves no room.
    UsageDaily.objects.create(
        owner=owner, agent=agent, day=today.replace(day=1), shard=7, input_tokens=990
    )
    message_post(session=session, content="hello again")
    session = _run(session)

    assert ModelCall.objects.filter(session=session).count() == 1
    last = Event.objects.filter(session=session, type="turn.finished").order_by("-seq").first()
    assert last.data["stop_reason"] == "budget_exceeded"
    assert "owner month budget" in session.transitions.order_by("-id").first().reason


@pytest.mark.django_db(transaction=True)
def test_a_key_budget_stops_the_keys_sessions_and_not_the_others(make_agent, make_session, owner):  # noqa: F811
    api_key_for(owner.username)
    key = owner.api_keys.get()
    agent = make_agent()
    keyed = make_session(agent=agent, api_key_id=key.pk)
    message_post(session=keyed, content="hello")
    keyed = _run(keyed)
    # The step wrote the call's tokens and cost to the key's spend rollup.
    spent = SpendDaily.objects.filter(api_key_id=key.pk).aggregate(
        i=Sum("input_tokens"), o=Sum("output_tokens"), n=Sum("model_calls")
    )
    assert (spent["i"], spent["o"], spent["n"]) == (keyed.input_tokens, keyed.output_tokens, 1)

    KeyBudget.objects.create(
        api_key=key, owner=owner, period="day", tokens=keyed.input_tokens + keyed.output_tokens + 10
    )
    owner_watch_reset()
    message_post(session=keyed, content="hello again")
    keyed = _run(keyed)
    assert ModelCall.objects.filter(session=keyed).count() == 1
    last = Event.objects.filter(session=keyed, type="turn.finished").order_by("-seq").first()
    assert last.data["stop_reason"] == "budget_exceeded"
    assert "API key day budget" in keyed.transitions.order_by("-id").first().reason

    # The owner's session opened without this key runs.
    other = make_session(agent=agent)
    message_post(session=other, content="hello")
    _run(other)
    assert ModelCall.objects.filter(session=other).count() == 1
