"""A paid model call's credits check: from the gate's figures when they clearly suffice
(no query), from the account row when they are close or this run already spent them."""

from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from billing.budgets import Spent
from billing.pressure import OwnerFigures
from billing.services import credits_grant
from llm.types import ChatMessage, ChatRequest
from sessions.engine.metering import model_credits_check
from tests.factories import ModelEndpointFactory

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
