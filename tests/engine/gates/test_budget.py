"""The gate's figures kept for a run: one read per turn, advanced locally with the
session's own spend, read again when the local estimate nears a limit or a turn begins."""

from collections.abc import Callable
from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from billing.models import OwnerBudget
from billing.pressure import owner_watch_reset
from billing.services import usage_statement
from engine.gates.budget import FiguresKeeper, gate_read
from sessions.models import Session

pytestmark = pytest.mark.django_db(transaction=True)


def _spend(session: Session, tokens: int) -> None:
    """What a step of `session` commits: its rollup, and its totals in the run's object."""
    with connection.cursor() as cursor:
        cursor.execute(
            *usage_statement(  # type: ignore[misc]
                owner_id=session.owner_id,
                agent_id=session.agent_id,
                session_id=session.pk,
                input_tokens=tokens,
                cost=Decimal(0),
                model_calls=1,
            )
        )
    session.input_tokens += tokens


def _owner_day(read) -> int:  # type: ignore[no-untyped-def]
    (spent,) = [s.tokens for b, s in read.budgets if (b.who, b.period) == ("owner", "day")]
    return spent


def _queries(run: Callable[[], object]) -> tuple[object, int]:
    with CaptureQueriesContext(connection) as captured:
        result = run()
    return result, len(captured.captured_queries)


@pytest.fixture
def budgeted(make_session, owner) -> Session:  # type: ignore[no-untyped-def]
    OwnerBudget.objects.create(owner=owner, day_tokens=1000)
    owner_watch_reset()
    session: Session = make_session()
    return session


def test_later_steps_of_a_turn_use_the_kept_figures_plus_their_own_spend(budgeted, make_session):  # type: ignore[no-untyped-def]
    keep = FiguresKeeper()
    agent = budgeted.agent
    read, queries = _queries(lambda: gate_read(budgeted, agent, keep))
    assert queries >= 1 and _owner_day(read) == 0

    _spend(budgeted, 100)
    read, queries = _queries(lambda: gate_read(budgeted, agent, keep))
    assert queries == 0  # no round trip on this step's path
    assert _owner_day(read) == 100

    # Without a keeper (or at a new turn) the gate reads every time.
    _, queries = _queries(lambda: gate_read(budgeted, agent))
    assert queries == 1
    budgeted.turn += 1
    read, queries = _queries(lambda: gate_read(budgeted, agent, keep))
    assert queries == 1 and _owner_day(read) == 100


def test_near_a_limit_the_figures_are_read_again_and_see_other_sessions(
    budgeted, make_session, settings
):  # type: ignore[no-untyped-def]
    # Crossing 80 % would also raise a cost notice (one INSERT, once per process and
    # period: tests/billing/test_webhook.py); here only the figures' reads are counted.
    settings.COST_NOTICE_THRESHOLDS = []
    keep = FiguresKeeper()
    agent = budgeted.agent
    gate_read(budgeted, agent, keep)
    other = make_session(agent=agent)
    _spend(other, 700)  # another session of the owner, unseen by this run's kept figures

    _spend(budgeted, 100)
    read, queries = _queries(lambda: gate_read(budgeted, agent, keep))
    assert (queries, _owner_day(read)) == (0, 100)  # far from the limit: the local estimate

    _spend(budgeted, 750)  # locally 850 of 1,000: near the limit
    read, queries = _queries(lambda: gate_read(budgeted, agent, keep))
    assert queries == 1
    assert _owner_day(read) == 1550  # everyone's spend: the next call will be refused


def test_a_rate_limit_pause_does_not_hold_a_database_connection(make_session, monkeypatch):  # type: ignore[no-untyped-def]
    from engine.gates import budget as budget_gate
    from llm.types import ChatMessage, ChatRequest

    session = make_session()
    endpoint = session.agent.model
    endpoint.rate_limit_calls_per_min = 1
    waits = iter([0.01, None])  # one short pause (inline, not deferred), then the slot
    monkeypatch.setattr(budget_gate, "rate_limit_take", lambda **_: next(waits))
    held_while_sleeping: list[bool] = []
    monkeypatch.setattr(
        budget_gate.time,
        "sleep",
        lambda _s: held_while_sleeping.append(connection.connection is not None),
    )
    connection.ensure_connection()
    request = ChatRequest(messages=(ChatMessage(role="user", content="hi"),))
    budget_gate.model_rate_limit(session, endpoint, request)
    assert held_while_sleeping == [False]
