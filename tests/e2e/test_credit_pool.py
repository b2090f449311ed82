"""A credit pool on the live stack: runs that wait for points hold no worker, and released
points go to the waiting runs highest value / cost first.

One worker of concurrency 1. A 10-point pool is full: its points are held by a paid call in
flight elsewhere (a session in `tool_wait` leased by another worker, as far as the database
can tell). Three sessions whose step asks for 10 points (values 1, 5 and 3: ROI 0.1, 0.5,
0.3) park in `waiting_credits`; meanwhile a fourth session, with no paid tool, runs to its
answer on the one worker slot. When the call in flight gives its points back (its results'
commit), the sweeper grants the queue and the three finish in ROI order: 5, 3, then 1.
"""

import time
import uuid
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.utils import timezone

from billing.models import CreditPool, PoolRequest
from billing.services import pool_grant_of, pool_grant_statement, pool_release_statement
from record.models import Session, Transition
from tests.e2e.support import api, create_session, post_message, turns_finished, wait_events
from tests.factories import (
    AgentFactory,
    ModelEndpointFactory,
    SessionFactory,
    ToolFactory,
    api_key_for,
)
from tests.stack import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

RULES = [
    {"when": {"last_tool": None}, "tool_calls": [{"tool": "pooled_clock"}]},
    {"answer": "done"},
]


def _wait_for(predicate, timeout: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def _held_elsewhere(pool_owner_id: int) -> uuid.UUID:
    """A paid call in flight on another worker: its session leased far ahead, its 10 points
    granted."""
    holder = SessionFactory(
        agent=AgentFactory(slug="pool-holder"),
        owner_id=pool_owner_id,
        state="tool_wait",
        lease_owner="another-worker",
        lease_expires_at=timezone.now() + timedelta(hours=1),
    )
    with connection.cursor() as cursor:
        cursor.execute(
            *pool_grant_statement(
                owner_id=pool_owner_id, key="pool:holder", session_id=holder.pk,
                action="elsewhere", value=100.0, cost=10,
            )
        )  # fmt: skip
        assert pool_grant_of(cursor.fetchone()).outcome == "granted"
    return holder.pk


def test_waiting_runs_hold_no_worker_and_are_granted_highest_roi_first(live_stack: Stack) -> None:
    rules = ModelEndpointFactory(name="rules", api="rules", options={})
    ToolFactory(name="pooled_clock", handler="builtin.current_time", roles=[], credit_cost=10)
    for value in (1, 3, 5):
        AgentFactory(
            slug=f"pooled-{value}", model=rules, tools=["pooled_clock"], rules=RULES, value=value
        )
    AgentFactory(slug="pool-free", model=rules)  # echoes; no paid tool
    CreditPool.objects.create(name="global", size=10)
    key = api_key_for("pool-owner")
    holder = _held_elsewhere(get_user_model().objects.get(username="pool-owner").pk)

    live_stack.stop("worker")
    live_stack.start_worker("worker", concurrency=1)
    try:
        live_stack.wait_worker_ready("worker")
        with api(live_stack, key) as client:
            ids = {value: create_session(client, f"pooled-{value}") for value in (1, 5, 3)}
            for value in (1, 5, 3):
                post_message(client, ids[value], "what time is it?")
                _wait_for(lambda v=value: Session.objects.get(pk=ids[v]).state == "waiting_credits")
            # Parked: no lease, nothing running them, and the queue in the admin's order.
            assert not Session.objects.filter(pk__in=ids.values(), lease_owner__isnull=False)
            queue = PoolRequest.objects.filter(status="waiting").order_by("-roi", "id")
            assert [(r.session_id, r.roi) for r in queue] == [
                (uuid.UUID(ids[5]), 0.5), (uuid.UUID(ids[3]), 0.3), (uuid.UUID(ids[1]), 0.1)
            ]  # fmt: skip
            # The one worker slot is free: another session runs to its answer meanwhile.
            free = create_session(client, "pool-free")
            post_message(client, free, "hello")
            wait_events(client, free, turns_finished(1), timeout=60)
            assert all(Session.objects.get(pk=ids[v]).state == "waiting_credits" for v in (1, 3, 5))

            # The call in flight elsewhere commits its results: its points come back.
            with connection.cursor() as cursor:
                cursor.execute(*pool_release_statement(session_id=holder))
            for value in (5, 3, 1):
                wait_events(client, ids[value], turns_finished(1), timeout=90)
    finally:
        live_stack.stop("worker")
        live_stack.start_worker("worker")
        live_stack.wait_worker_ready("worker")

    granted = PoolRequest.objects.exclude(key="pool:holder").order_by("granted_at")
    assert [str(r.session_id) for r in granted] == [ids[5], ids[3], ids[1]]
    assert set(granted.values_list("status", flat=True)) == {"released"}
    assert CreditPool.objects.get(name="global").in_use == 0
    for value in (1, 3, 5):
        session = Session.objects.get(pk=ids[value])
        assert session.state == "finished"
        moves = list(
            Transition.objects.filter(session=session)
            .order_by("id")
            .values_list("from_state", "to_state")
        )
        assert ("tool_wait", "waiting_credits") in moves
        assert ("waiting_credits", "tool_wait") in moves
