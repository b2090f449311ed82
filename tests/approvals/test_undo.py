"""A decision's undo window (APPROVAL_UNDO_S): the run goes on only after it, a decision is
withdrawn or changed within it, and after it the change is 409 saying when the step ran."""

import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from approvals.models import Approval, ApprovalTransition
from approvals.states import UNDO_HOLD
from engine import session_run
from record.errors import Conflict
from record.models import Session
from sessions.services import approval_change, approval_decide, message_post, sessions_sweep
from tests.approvals.conftest import EFFECTS

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def scheduled(monkeypatch: pytest.MonkeyPatch, settings: Any) -> list[tuple[Any, ...]]:
    """The runs the decisions scheduled, (session id, value, after_s), none sent to a broker."""
    settings.APPROVAL_UNDO_S = 30.0
    sent: list[tuple[Any, ...]] = []
    monkeypatch.setattr("record.dispatch.run_enqueue_on_commit", lambda *args: sent.append(args))
    return sent


def _approved(approver: Any, make_session: Any, approve: bool = True) -> Approval:
    session = make_session()
    message_post(session=session, content="refund A1 80")
    assert session_run(session_id=session.pk).stopped == "idle"
    approval = Approval.objects.get(session=session)
    user, _ = approver
    return approval_decide(
        approval_id=approval.pk,
        approve=approve,
        user=user,
        groups=["approvers"],
        comment="" if approve else "no",
    )


def _window_closes(session_id: Any) -> None:
    """The undo window's end, as the database clock will see it: its lease lapsed."""
    Session.objects.filter(pk=session_id).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )


def test_the_run_goes_on_only_after_the_window(approver, make_session, scheduled):
    approval = _approved(approver, make_session)
    session = Session.objects.get(pk=approval.session_id)
    assert session.state == "tool_wait" and session.lease_owner == UNDO_HOLD
    assert session.lease_expires_at > timezone.now() + timedelta(seconds=25)
    # The continuation is scheduled for the window's end, not now.
    assert scheduled[-1] == (session.pk, session.value, 30.0)
    # A worker woken sooner (another message, a sweep) does not take the run up.
    assert session_run(session_id=session.pk).stopped == "not_acquired"
    assert sessions_sweep() == [] and EFFECTS == []

    _window_closes(session.pk)
    assert session_run(session_id=session.pk).stopped == "idle"
    session = Session.objects.get(pk=session.pk)
    assert session.state == "finished" and len(EFFECTS) == 1
    assert not session.resume_check  # a window that closed is no crash to recover from


def test_the_sweeper_wakes_a_run_whose_window_closed_without_a_recovery_check(
    approver, make_session, scheduled
):
    approval = _approved(approver, make_session)
    _window_closes(approval.session_id)
    assert sessions_sweep() == [str(approval.session_id)]
    session = Session.objects.get(pk=approval.session_id)
    assert session.lease_owner is None and not session.resume_check


def test_withdrawn_within_the_window_the_call_waits_for_a_person_again(
    approver, make_session, scheduled
):
    approval = _approved(approver, make_session)
    user, _ = approver
    withdrawn = approval_change(
        approval_id=approval.pk, decision="pending", user=user, groups=["approvers"]
    )
    session = Session.objects.get(pk=approval.session_id)
    assert withdrawn.status == "pending" and session.state == "awaiting_approval"
    assert session.lease_owner is None  # nothing held back any more
    assert session_run(session_id=session.pk).stopped == "not_acquired"
    assert EFFECTS == []


def test_changed_within_the_window_to_a_rejection_it_never_runs(approver, make_session, scheduled):
    approval = _approved(approver, make_session)
    user, _ = approver
    approval_change(
        approval_id=approval.pk, decision="rejected", user=user, groups=["approvers"], comment="no"
    )
    assert Session.objects.get(pk=approval.session_id).lease_owner == UNDO_HOLD  # same window
    _window_closes(approval.session_id)
    session_run(session_id=approval.session_id)
    assert EFFECTS == [] and Session.objects.get(pk=approval.session_id).state == "finished"


def test_after_the_window_a_change_is_409_saying_when_the_step_ran(
    approver, make_session, scheduled
):
    approval = _approved(approver, make_session)
    user, _ = approver
    _window_closes(approval.session_id)
    closed_at = Session.objects.get(pk=approval.session_id).lease_expires_at
    with pytest.raises(Conflict) as closed:
        approval_change(
            approval_id=approval.pk, decision="pending", user=user, groups=["approvers"]
        )
    assert closed.value.code == "call_started"
    assert closed.value.details["reason"] == "the undo window has closed"
    assert closed.value.details["ran_at"] == closed_at.isoformat()
    assert closed_at.isoformat() in closed.value.message

    session_run(session_id=approval.session_id)
    with pytest.raises(Conflict) as ran:
        approval_change(approval_id=approval.pk, decision="rejected", user=user, groups=["approvers"], comment="x")  # fmt: skip
    assert ran.value.details["ran_at"] is not None
    assert len(EFFECTS) == 1 and Approval.objects.get(pk=approval.pk).status == "approved"


def test_the_deadlines_decision_has_no_window(approver, make_session, scheduled):
    """Nobody to undo it: the deadline policy's decision goes on at once."""
    session = make_session()
    message_post(session=session, content="refund A1 80")
    session_run(session_id=session.pk)
    Approval.objects.filter(session=session).update(deadline=timezone.now() - timedelta(seconds=1))
    sessions_sweep()
    session = Session.objects.get(pk=session.pk)
    assert session.lease_owner != UNDO_HOLD


def _client(key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    return client


def test_rest_withdraw_within_the_window_and_409_after_it(approver, make_session, scheduled):
    _, key = approver
    approval = _approved(approver, make_session)
    base = f"/api/v1/approvals/{approval.pk}"
    [listed] = _client(key).get("/api/v1/approvals/?status=approved").json()
    assert listed["undo_until"] == approval.undo_until.isoformat().replace("+00:00", "Z")
    response = _client(key).post(f"{base}/withdraw/", {"comment": "hold on"}, format="json")
    assert response.status_code == 200 and response.json()["status"] == "pending"

    user, _ = approver
    approval_decide(approval_id=approval.pk, approve=True, user=user, groups=["approvers"])
    _window_closes(approval.session_id)
    late = _client(key).post(f"{base}/withdraw/", {"comment": "too late"}, format="json")
    assert late.status_code == 409
    error = late.json()["error"]
    assert error["code"] == "call_started" and error["details"]["ran_at"]
    assert error["details"]["ran_at"] in error["message"]


WINDOW_S = 0.4
# The approver's Undo lands this long after the window's end (negative: before it).
OFFSETS_S = [-0.05, -0.01, 0.0, 0.01, 0.05]


@pytest.mark.parametrize("offset", OFFSETS_S)
def test_an_undo_racing_the_worker_at_the_windows_end_holds_back_or_is_409_never_both(
    approver, make_session, scheduled, settings, offset
):
    """The worker the countdown wakes and an approver's Undo, on two connections at the
    window's end: either the Undo commits first and the call never runs, or the window
    closed first and the Undo is 409 `call_started`."""
    settings.APPROVAL_UNDO_S = WINDOW_S
    approval = _approved(approver, make_session)
    user, _ = approver
    ends = Session.objects.get(pk=approval.session_id).lease_expires_at.timestamp()
    results: dict[str, Any] = {}

    def worker() -> None:
        # As the countdown's task would: take the run up as soon as the lease lets it.
        try:
            while time.time() < ends + 2:
                if session_run(session_id=approval.session_id).stopped != "not_acquired":
                    break
                time.sleep(0.002)
        finally:
            connection.close()

    def undo() -> None:
        try:
            time.sleep(max(0.0, ends + offset - time.time()))
            results["undo"] = approval_change(
                approval_id=approval.pk, decision="pending", user=user, groups=["approvers"]
            )
        except Conflict as exc:
            results["undo"] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=worker), threading.Thread(target=undo)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    approval.refresh_from_db()
    outcome = results["undo"]
    if isinstance(outcome, Approval):
        assert EFFECTS == [] and approval.status == "pending"
        assert Session.objects.get(pk=approval.session_id).state == "awaiting_approval"
        assert ApprovalTransition.objects.filter(approval=approval).count() == 2
    else:
        assert outcome.code == "call_started", outcome
        assert outcome.details["ran_at"]
        session_run(session_id=approval.session_id)  # whatever is left to run
        assert len(EFFECTS) == 1 and approval.status == "approved"
        assert ApprovalTransition.objects.filter(approval=approval).count() == 1
