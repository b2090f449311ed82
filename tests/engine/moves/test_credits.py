"""Runs parked for credit pool points: a step whose request does not fit parks its session
(waiting_credits: no lease, no worker), and released points wake the waiting runs highest
value / cost first, in-process (the live stack's test is tests/e2e/test_credit_pool.py)."""

import uuid

import pytest
from django.db import connection

from billing.models import CreditPool, PoolRequest
from billing.services import pool_grant_of, pool_grant_statement, pool_release_statement
from engine import pool_wake, session_run
from record.models import Event, Session, ToolCall, Transition
from sessions.services import message_post, session_cancel
from sessions.services.sweep import credit_pools_reconcile
from tests.factories import ToolFactory

pytestmark = pytest.mark.django_db(transaction=True)

RULES = [
    {"when": {"last_tool": None}, "tool_calls": [{"tool": "coupon", "args": {}}]},
    {"answer": "done"},
]


@pytest.fixture
def pool(make_agent, owner):  # type: ignore[no-untyped-def]
    """A 10-point pool held full by a call of another session, and an agent whose one tool
    costs 10 points of it."""
    ToolFactory(name="coupon", credit_cost=10)
    pool = CreditPool.objects.create(name="global", size=10)
    holder = uuid.uuid4()
    with connection.cursor() as cursor:
        cursor.execute(
            *pool_grant_statement(
                owner_id=owner.pk, key="holder", session_id=holder,
                action="other", value=1.0, cost=10,
            )
        )  # fmt: skip
        assert pool_grant_of(cursor.fetchone()).outcome == "granted"
    return pool, holder, make_agent(tools=["coupon"], rules=RULES)


def _release(session_id) -> list[str]:  # type: ignore[no-untyped-def]
    with connection.cursor() as cursor:
        cursor.execute(*pool_release_statement(session_id=session_id))
    return pool_wake()


def _state(session: Session) -> str:
    return Session.objects.get(pk=session.pk).state


def test_waiting_runs_park_and_are_granted_highest_roi_first(pool, make_session) -> None:  # type: ignore[no-untyped-def]
    pool_row, holder, agent = pool
    low, high, middle = (make_session(agent=agent, value=v) for v in (1.0, 5.0, 3.0))
    for session in (low, high, middle):
        message_post(session=session, content="a coupon please")
        result = session_run(session_id=session.pk)
        # Parked: the run ended, nothing holds the session.
        assert (result.stopped, _state(session)) == ("idle", "waiting_credits")
        assert Session.objects.get(pk=session.pk).lease_owner is None
    parked = Transition.objects.get(session=high, to_state="waiting_credits")
    assert (parked.from_state, parked.trigger) == ("tool_wait", "credits_wait")
    wait = Event.objects.get(session=high, type="progress", data__stage="credits_wait")
    assert (wait.data["roi"], wait.data["cost"], wait.data["pool_free"]) == (0.5, 10, 0)

    finished = []
    woken = _release(holder)
    while woken:
        assert len(woken) == 1  # 10 points: one at a time
        (session_id,) = woken
        assert Session.objects.get(pk=session_id).state == "tool_wait"
        assert session_run(session_id=session_id).stopped == "idle"
        assert Session.objects.get(pk=session_id).state == "finished"
        finished.append(session_id)
        # Its results' commit gave the points back and woke the next one.
        woken = [
            str(s.pk) for s in Session.objects.filter(state="tool_wait", pk__in=[low.pk, middle.pk])
        ]
    assert finished == [str(high.pk), str(middle.pk), str(low.pk)]
    pool_row.refresh_from_db()
    assert pool_row.in_use == 0
    assert set(PoolRequest.objects.exclude(key="holder").values_list("status", flat=True)) == {
        "released"
    }


def test_a_cancelled_waiting_run_leaves_the_queue_and_a_lost_wake_up_is_found(
    pool, make_session
) -> None:  # type: ignore[no-untyped-def]
    _, holder, agent = pool
    first, second = make_session(agent=agent, value=5.0), make_session(agent=agent, value=1.0)
    for session in (first, second):
        message_post(session=session, content="a coupon please")
        session_run(session_id=session.pk)
    assert session_cancel(session=Session.objects.get(pk=first.pk), reason="no longer needed")
    assert _state(first) == "cancelled"
    with connection.cursor() as cursor:
        cursor.execute(*pool_release_statement(session_id=holder))
    # The release's own wake-up was lost (no pool_wake): the sweeper's reconciliation wakes.
    assert credit_pools_reconcile() == [str(second.pk)]
    assert PoolRequest.objects.get(session_id=first.pk).status == "refused"
    assert session_run(session_id=second.pk).stopped == "idle"
    assert _state(second) == "finished"


def test_a_pool_that_shrinks_or_goes_lets_its_parked_runs_go_on(pool, make_session) -> None:  # type: ignore[no-untyped-def]
    pool_row, _, agent = pool
    shrunk, dropped = make_session(agent=agent), make_session(agent=agent)
    for session in (shrunk, dropped):
        message_post(session=session, content="a coupon please")
        session_run(session_id=session.pk)
    pool_row.size = 5  # 10 points can never fit now: refused, and told so
    pool_row.save()
    assert set(credit_pools_reconcile()) == {str(shrunk.pk), str(dropped.pk)}
    session_run(session_id=shrunk.pk)
    call = ToolCall.objects.get(session=shrunk)
    assert (call.status, call.output["code"]) == ("rejected", "insufficient_credits")
    assert "can no longer hold its estimated cost, 10 points" in call.error
    assert _state(shrunk) == "finished"

    # Its pool deleted while another run was parked: the step asks again and runs unpooled.
    third = make_session(agent=agent)
    # (The sweeper gave the holder's points back: its session does not exist. Full again.)
    CreditPool.objects.filter(pk=pool_row.pk).update(size=10, in_use=10)
    message_post(session=third, content="a coupon please")
    session_run(session_id=third.pk)
    assert _state(third) == "waiting_credits"
    CreditPool.objects.all().delete()
    assert credit_pools_reconcile() == [str(third.pk)]
    session_run(session_id=third.pk)
    assert ToolCall.objects.get(session=third).status == "success"
    assert _state(third) == "finished"
