"""Withdrawing or changing a decision while its call has not started (and 409 once it has)."""

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from accounts.services import api_key_create, approver_grant
from approvals.models import Approval, ApprovalTransition
from audit.models import AuditEntry
from engine import session_run
from record.errors import Conflict, Forbidden, InvalidInput
from record.models import Event, Session, ToolCall
from sessions.services import approval_change, approval_decide, message_post
from tests.approvals.conftest import EFFECTS
from tests.factories import AgentFactory

pytestmark = pytest.mark.django_db(transaction=True)

TWO_REFUNDS = [
    {"when": {"user": "^two", "last_tool": None},
     "tool_calls": [{"tool": "refund", "args": {"order": "A1", "amount": "80"}},
                    {"tool": "refund", "args": {"order": "A2", "amount": "90"}}]},
    {"when": {"last_tool": "refund"}, "answer": "done: {{ result }}"},
]  # fmt: skip


@pytest.fixture(autouse=True)
def _no_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("record.dispatch.run_enqueue_on_commit", lambda *args: None)


def _pending(make_session: Any, content: str = "refund A1 80", **fields: Any) -> Session:
    session = make_session(**fields)
    message_post(session=session, content=content)
    assert session_run(session_id=session.pk).stopped == "idle"
    return Session.objects.get(pk=session.pk)


def _decide(approver: Any, approval: Approval, approve: bool = True, **kw: Any) -> Approval:
    user, _ = approver
    kw.setdefault("comment", "" if approve else "no")
    return approval_decide(
        approval_id=approval.pk, approve=approve, user=user, groups=["approvers"], **kw
    )


def _change(approver: Any, approval: Approval, decision: str, **kw: Any) -> Approval:
    user, _ = approver
    return approval_change(
        approval_id=approval.pk, decision=decision, user=user, groups=["approvers"], **kw
    )


def _resolved(session: Session) -> list[dict[str, Any]]:
    return [
        e.data
        for e in Event.objects.filter(session=session, type="approval.resolved").order_by("seq")
    ]


def test_a_decision_withdrawn_while_the_step_waits_is_pending_again(
    approver, make_session, refund_tool, rules_model
):
    agent = AgentFactory(slug="two-refunds", model=rules_model, tools=["refund"], rules=TWO_REFUNDS)
    session = _pending(make_session, "two refunds", agent=agent)
    first, second = Approval.objects.filter(session=session).order_by("requested_at")
    _decide(approver, first)
    assert Session.objects.get(pk=session.pk).state == "awaiting_approval"
    Approval.objects.filter(pk=first.pk).update(deadline=timezone.now() + timedelta(seconds=5))

    withdrawn = _change(approver, first, "pending", comment="wrong customer")
    assert (withdrawn.status, withdrawn.decided_by_name, withdrawn.decided_at) == (
        "pending",
        "",
        None,
    )
    assert withdrawn.deadline > timezone.now() + timedelta(seconds=500)  # a fresh clock
    moves = list(ApprovalTransition.objects.filter(approval=first).values_list("outcome", "actor"))
    assert moves == [("approved", "alice"), ("withdrawn", "alice")]
    assert _resolved(session)[-1] == {
        "approval_id": str(first.pk), "outcome": "withdrawn", "by": "alice", "comment": "",
        "previous": "approved",
    }  # fmt: skip
    assert Event.objects.filter(session=session, type="approval.requested").count() == 3
    entry = AuditEntry.objects.get(action="approval.withdrawn")
    assert (entry.before, entry.after, entry.reason) == (
        {"status": "approved"}, {"status": "pending"}, "wrong customer",
    )  # fmt: skip

    _decide(approver, Approval.objects.get(pk=first.pk), approve=False)
    _decide(approver, second)
    session_run(session_id=session.pk)
    assert [e["order"] for e in EFFECTS] == ["A2"]


def test_an_approval_changed_to_a_rejection_before_a_worker_runs_it_never_runs(
    approver, make_session
):
    session = _pending(make_session)
    approval = Approval.objects.get(session=session)
    _decide(approver, approval)
    session = Session.objects.get(pk=session.pk)
    assert session.state == "tool_wait" and not session.lease_owner  # no worker took it yet

    changed = _change(approver, approval, "rejected", comment="duplicate refund")
    assert (changed.status, changed.comment, changed.decided_by_name) == (
        "rejected", "duplicate refund", "alice",
    )  # fmt: skip
    assert Session.objects.get(pk=session.pk).version > session.version
    session_run(session_id=session.pk)
    call = ToolCall.objects.get(session=session)
    assert EFFECTS == [] and call.status == "rejected" and "duplicate refund" in call.error
    assert _resolved(session)[-1]["previous"] == "approved"
    assert _resolved(session)[-1]["outcome"] == "rejected"
    assert AuditEntry.objects.get(action="approval.changed").after == {"status": "rejected"}


def test_a_withdrawal_from_tool_wait_sends_the_session_back_to_wait(approver, make_session):
    session = _pending(make_session)
    approval = Approval.objects.get(session=session)
    _decide(approver, approval)
    _change(approver, approval, "pending")
    assert Session.objects.get(pk=session.pk).state == "awaiting_approval"
    assert session_run(session_id=session.pk).stopped == "not_acquired"  # nothing to run
    assert EFFECTS == []
    _decide(approver, Approval.objects.get(pk=approval.pk))
    session_run(session_id=session.pk)
    assert len(EFFECTS) == 1 and Session.objects.get(pk=session.pk).state == "finished"


def test_a_rejection_changed_to_an_approval_runs_the_edited_arguments(approver, make_session):
    session = _pending(make_session)
    approval = Approval.objects.get(session=session)
    _decide(approver, approval, approve=False)
    changed = _change(approver, approval, "approved", arguments={"order": "A1", "amount": 20})
    assert changed.edited_arguments == {"order": "A1", "amount": 20}
    with pytest.raises(InvalidInput):
        _change(approver, changed, "approved")  # already approved
    session_run(session_id=session.pk)
    assert [e["amount"] for e in EFFECTS] == [20]


def test_once_the_call_has_started_the_decision_stands_409(approver, make_session):
    session = _pending(make_session)
    approval = Approval.objects.get(session=session)
    _decide(approver, approval)
    # A worker holds the run: it may already have read the decision.
    Session.objects.filter(pk=session.pk).update(
        lease_owner="w1", lease_expires_at=timezone.now() + timedelta(seconds=30)
    )
    with pytest.raises(Conflict) as held:
        _change(approver, approval, "pending")
    assert held.value.code == "call_started"
    assert held.value.details["reason"] == "a worker has picked the run up"
    # The call was sent.
    Session.objects.filter(pk=session.pk).update(lease_owner=None)
    ToolCall.objects.filter(session=session).update(dispatched_at=timezone.now())
    with pytest.raises(Conflict) as sent:
        _change(approver, approval, "rejected", comment="too late")
    assert sent.value.details["reason"] == "the call was sent"
    ToolCall.objects.filter(session=session).update(dispatched_at=None)
    session_run(session_id=session.pk)  # it ran: the turn is over
    with pytest.raises(Conflict) as ran:
        _change(approver, approval, "rejected", comment="too late")
    assert ran.value.code == "call_started" and "finished" in ran.value.details["reason"]
    assert Approval.objects.get(pk=approval.pk).status == "approved"
    assert ApprovalTransition.objects.filter(approval=approval).count() == 1
    assert not AuditEntry.objects.filter(action__in=["approval.withdrawn", "approval.changed"])


def test_only_a_persons_approved_or_rejected_call_decision_changes(approver, make_session):
    session = _pending(make_session)
    approval = Approval.objects.get(session=session)
    with pytest.raises(Conflict) as pending:
        _change(approver, approval, "rejected", comment="x")
    assert pending.value.code == "approval_not_changeable"
    Approval.objects.filter(pk=approval.pk).update(status="expired")
    with pytest.raises(Conflict):
        _change(approver, Approval.objects.get(pk=approval.pk), "approved")
    Approval.objects.filter(pk=approval.pk).update(status="approved", kind="recovery_review")
    with pytest.raises(Conflict):
        _change(approver, Approval.objects.get(pk=approval.pk), "pending")
    with pytest.raises(InvalidInput):
        _change(approver, approval, "maybe")


def test_the_same_rights_as_deciding(approver, make_session, settings):
    session = _pending(make_session)
    approval = Approval.objects.get(session=session)
    _decide(approver, approval)
    user, _ = approver
    with pytest.raises(Forbidden):
        approval_change(approval_id=approval.pk, decision="pending", user=user, groups=["other"])
    Session.objects.filter(pk=session.pk).update(owner=user)
    with pytest.raises(Forbidden) as own:
        _change(approver, approval, "pending")
    assert own.value.code == "four_eyes"


def _client(key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    return client


def test_withdraw_and_change_over_rest(approver, make_session):
    _, key = approver
    session = _pending(make_session)
    approval = Approval.objects.get(session=session)
    _decide(approver, approval)
    base = f"/api/v1/approvals/{approval.pk}"
    response = _client(key).post(f"{base}/withdraw/", {"comment": "hold on"}, format="json")
    assert response.status_code == 200 and response.json()["status"] == "pending"
    _decide(approver, Approval.objects.get(pk=approval.pk))
    no_comment = _client(key).post(f"{base}/change/", {"decision": "rejected"}, format="json")
    assert no_comment.status_code == 400
    response = _client(key).post(
        f"{base}/change/", {"decision": "rejected", "comment": "no"}, format="json"
    )
    assert response.status_code == 200 and response.json()["status"] == "rejected"
    entry = AuditEntry.objects.filter(action="approval.changed").get()
    assert entry.actor == "api:alice" and entry.key_prefix == key[:10]

    session_run(session_id=session.pk)
    late = _client(key).post(f"{base}/change/", {"decision": "approved"}, format="json")
    assert late.status_code == 409 and late.json()["error"]["code"] == "call_started"
    customer = api_key_create(username="customer2", roles=[]).raw
    assert _client(customer).post(f"{base}/withdraw/", {}, format="json").status_code == 403
    approver_grant(username="customer2", groups=["managers"])
    assert _client(customer).post(f"{base}/withdraw/", {}, format="json").status_code == 403
