"""Races on one approval give exactly one outcome: real concurrent database connections."""

import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.utils import timezone

from accounts.services import api_key_create, approver_grant
from approvals.models import Approval, ApprovalTransition
from engine import session_run
from record.errors import Conflict
from record.models import Event, Session
from sessions.services import (
    approval_change,
    approval_decide,
    approvals_expire_due,
    message_post,
)
from tests.approvals.conftest import EFFECTS

pytestmark = pytest.mark.django_db(transaction=True)


def _concurrently(*calls: Callable[[], Any]) -> list[Any]:
    """Run each call on its own thread (and database connection), released together."""
    barrier = threading.Barrier(len(calls))
    results: list[Any] = [None] * len(calls)

    def run(i: int, call: Callable[[], Any]) -> None:
        try:
            barrier.wait()
            results[i] = call()
        except Exception as exc:  # noqa: BLE001 - the outcome is what the test compares
            results[i] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return results


def _lock_waiters() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock'"
        )
        return cursor.fetchone()[0]


def _concurrently_behind(session_id: Any, *calls: Callable[[], Any]) -> list[Any]:
    """`_concurrently`, with the session's row locked until every call waits for it.

    Each call has then read its approval as it was before any of them changed it, which
    is the race the conditional update must settle. Released together alone, a slow
    machine sometimes ran one call to its commit before the other had started: both then
    succeeded, one after the other, which is not a race.
    """
    done: list[list[Any]] = []
    with transaction.atomic():
        Session.objects.select_for_update(no_key=True).get(pk=session_id)
        runner = threading.Thread(target=lambda: done.append(_concurrently(*calls)))
        runner.start()
        deadline = time.monotonic() + 20
        while _lock_waiters() < len(calls):
            assert time.monotonic() < deadline, "the calls never waited for the session's lock"
            time.sleep(0.01)
    runner.join(30)
    return done[0]


def _pending(make_session: Callable[..., Session]) -> Approval:
    session = make_session()
    message_post(session=session, content="refund A1 80")
    session_run(session_id=session.pk)
    return Approval.objects.get(session=session)


@pytest.mark.parametrize("attempt", range(5))
def test_two_approvers_racing_get_exactly_one_outcome(make_session, attempt):
    users = []
    for name in ("alice", "bob"):
        users.append(api_key_create(username=name, roles=[]).api_key.owner)
        approver_grant(username=name)
    approval = _pending(make_session)

    results = _concurrently(
        lambda: approval_decide(
            approval_id=approval.pk, approve=True, user=users[0], groups=["approvers"]
        ),
        lambda: approval_decide(
            approval_id=approval.pk,
            approve=False,
            user=users[1],
            groups=["approvers"],
            comment="no",
        ),
    )
    winners = [r for r in results if isinstance(r, Approval)]
    losers = [r for r in results if isinstance(r, Conflict)]
    assert len(winners) == 1 and len(losers) == 1, results
    assert losers[0].code == "approval_resolved"
    assert ApprovalTransition.objects.filter(approval=approval).count() == 1
    assert Event.objects.filter(session=approval.session_id, type="approval.resolved").count() == 1
    session_run(session_id=approval.session_id)
    assert len(EFFECTS) == (1 if winners[0].status == "approved" else 0)


@pytest.mark.parametrize("attempt", range(5))
def test_an_approver_racing_the_deadline_gets_exactly_one_outcome(make_session, attempt):
    user = api_key_create(username="alice", roles=[]).api_key.owner
    approver_grant(username="alice")
    approval = _pending(make_session)
    Approval.objects.filter(pk=approval.pk).update(deadline=timezone.now() - timedelta(seconds=1))

    results = _concurrently(
        lambda: approval_decide(
            approval_id=approval.pk, approve=True, user=user, groups=["approvers"]
        ),
        approvals_expire_due,
    )
    approval.refresh_from_db()
    decided, swept = results
    if isinstance(decided, Approval):
        assert swept == [] and approval.status == "approved"
    else:
        assert isinstance(decided, Conflict) and swept == [str(approval.pk)]
        assert approval.status == "expired"
    assert ApprovalTransition.objects.filter(approval=approval).count() == 1
    assert Event.objects.filter(session=approval.session_id, type="approval.resolved").count() == 1
    session_run(session_id=approval.session_id)
    assert Session.objects.get(pk=approval.session_id).state == "finished"
    assert len(EFFECTS) == (1 if approval.status == "approved" else 0)


def test_a_hundred_gated_calls_across_sessions_none_runs_before_its_decision(make_session):
    user = api_key_create(username="alice", roles=[]).api_key.owner
    approver_grant(username="alice")
    sessions = [make_session() for _ in range(100)]
    for i, session in enumerate(sessions):
        message_post(session=session, content=f"refund O{i} {51 + i}")
        session_run(session_id=session.pk)

    assert EFFECTS == []
    assert Approval.objects.filter(status="pending").count() == 100
    assert set(
        Session.objects.filter(pk__in=[s.pk for s in sessions]).values_list("state", flat=True)
    ) == {"awaiting_approval"}
    approvals = list(Approval.objects.order_by("requested_at"))
    for approval in approvals[::2]:
        approval_decide(approval_id=approval.pk, approve=True, user=user, groups=["approvers"])
    for approval in approvals[1::2]:
        approval_decide(
            approval_id=approval.pk, approve=False, user=user, groups=["approvers"], comment="no"
        )
    for session in sessions:
        session_run(session_id=session.pk)

    approved = {a.arguments["order"] for a in approvals[::2]}
    assert sorted(e["order"] for e in EFFECTS) == sorted(approved)
    assert len({e["key"] for e in EFFECTS}) == 50
    assert set(
        Session.objects.filter(pk__in=[s.pk for s in sessions]).values_list("state", flat=True)
    ) == {"finished"}


def _approved(make_session: Callable[..., Session], user: Any) -> Approval:
    """An approved call whose session waits in tool_wait for a worker (none holds it yet)."""
    approval = _pending(make_session)
    approval_decide(approval_id=approval.pk, approve=True, user=user, groups=["approvers"])
    session = Session.objects.get(pk=approval.session_id)
    assert session.state == "tool_wait" and not session.lease_owner
    return Approval.objects.get(pk=approval.pk)


WORKER_DELAYS_S = [0.0, 0.002, 0.005, 0.01, 0.02, 0.05]


@pytest.mark.parametrize("decision", ["pending", "rejected"])
@pytest.mark.parametrize("attempt", range(len(WORKER_DELAYS_S)))
def test_a_change_racing_the_worker_holds_the_call_back_or_is_409_never_both(
    make_session, decision, attempt
):
    """The worker picking the run up and an approver taking the approval back, on two
    connections at once: either the change commits first and the call never runs, or the
    worker got there first and the change is 409 `call_started`."""
    user = api_key_create(username="alice", roles=[]).api_key.owner
    approver_grant(username="alice")
    approval = _approved(make_session, user)
    # The worker starts a little later in each attempt, so that both orders happen.
    delay = WORKER_DELAYS_S[attempt]

    def change() -> Any:
        return approval_change(
            approval_id=approval.pk, decision=decision, user=user, groups=["approvers"],
            comment="wait",
        )  # fmt: skip

    def worker() -> Any:
        time.sleep(delay)
        return session_run(session_id=approval.session_id)

    changed, _run = _concurrently(change, worker)
    session_run(session_id=approval.session_id)  # whatever is left to run
    approval.refresh_from_db()
    print(
        "RACE",
        "change-won"
        if isinstance(changed, Approval)
        else f"worker-won {getattr(changed, 'details', changed)}",
    )
    if isinstance(changed, Approval):
        assert EFFECTS == [] and approval.status == decision
        assert ApprovalTransition.objects.filter(approval=approval).count() == 2
    else:
        assert isinstance(changed, Conflict) and changed.code == "call_started", changed
        assert len(EFFECTS) == 1 and approval.status == "approved"
        assert ApprovalTransition.objects.filter(approval=approval).count() == 1


@pytest.mark.parametrize("attempt", range(5))
def test_two_approvers_changing_one_decision_get_exactly_one_change(make_session, attempt):
    users = []
    for name in ("alice", "bob"):
        users.append(api_key_create(username=name, roles=[]).api_key.owner)
        approver_grant(username=name)
    approval = _approved(make_session, users[0])

    results = _concurrently_behind(
        approval.session_id,
        lambda: approval_change(
            approval_id=approval.pk, decision="pending", user=users[0], groups=["approvers"]
        ),
        lambda: approval_change(
            approval_id=approval.pk,
            decision="rejected",
            user=users[1],
            groups=["approvers"],
            comment="no",
        ),  # fmt: skip
    )
    winners = [r for r in results if isinstance(r, Approval)]
    losers = [r for r in results if isinstance(r, Conflict)]
    assert len(winners) == 1 and len(losers) == 1, results
    assert losers[0].code in ("approval_resolved", "approval_not_changeable"), losers[0].code
    assert ApprovalTransition.objects.filter(approval=approval).count() == 2
    changes = Event.objects.filter(
        session=approval.session_id, type="approval.resolved", data__previous="approved"
    )
    assert changes.count() == 1
