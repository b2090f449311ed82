"""The approvals REST API: who may use it, and its 400/403/404/409 answers."""

import uuid

import pytest
from rest_framework.test import APIClient

from accounts.services import api_key_create, approver_grant
from approvals.models import Approval
from engine import session_run
from record.models import Message, Session
from sessions.services import message_post
from tests.approvals.conftest import EFFECTS

pytestmark = pytest.mark.django_db(transaction=True)


def _client(key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    return client


@pytest.fixture
def pending(make_session) -> Approval:  # type: ignore[no-untyped-def]
    session = make_session()
    message_post(session=session, content="refund A1 80")
    session_run(session_id=session.pk)
    return Approval.objects.get(session=session)


def test_an_approver_lists_pending_approvals_in_the_contract_shape(approver, pending):
    _, key = approver
    response = _client(key).get("/api/v1/approvals/", {"status": "pending"})
    assert response.status_code == 200
    [row] = response.json()
    assert {
        "id",
        "session",
        "tool",
        "arguments",
        "risk_level",
        "reason",
        "status",
        "requested_at",
        "deadline",
    } <= set(row)
    assert row["id"] == str(pending.pk) and row["session"] == str(pending.session_id)
    assert row["tool"] == "refund" and row["status"] == "pending"
    assert _client(key).get("/api/v1/approvals/", {"status": "approved"}).json() == []
    bad = _client(key).get("/api/v1/approvals/", {"status": "nope"})
    assert bad.status_code == 400 and bad.json()["error"]["details"] == {"field": "status"}


@pytest.mark.parametrize("path", ["", "{id}/approve/", "{id}/reject/"])
def test_a_customer_key_and_a_key_without_approver_rights_are_refused(pending, path):
    customer = api_key_create(username="customer", roles=["support"]).raw
    staff = api_key_create(username="operator", roles=["support", "admin"]).raw
    url = "/api/v1/approvals/" + path.format(id=pending.pk)
    for key in (customer, staff):
        client = _client(key)
        response = (
            client.get(url) if not path else client.post(url, {"comment": "x"}, format="json")
        )
        assert response.status_code == 403, response.content
        assert response.json()["error"]["code"] == "permission_denied"
    assert APIClient().get(url).status_code == 401
    pending.refresh_from_db()
    assert pending.status == "pending"


def test_approve_then_a_second_decision_is_409_approval_resolved(approver, pending):
    _, key = approver
    client = _client(key)
    first = client.post(
        f"/api/v1/approvals/{pending.pk}/approve/", {"comment": "ok"}, format="json"
    )
    assert first.status_code == 200, first.content
    assert first.json()["status"] == "approved" and first.json()["decided_by"] == "alice"
    again = client.post(f"/api/v1/approvals/{pending.pk}/reject/", {"comment": "no"}, format="json")
    assert again.status_code == 409
    assert again.json()["error"]["code"] == "approval_resolved"
    assert Session.objects.get(pk=pending.session_id).state == "tool_wait"


def test_edited_arguments_that_fail_the_schema_are_400_and_change_nothing(approver, pending):
    _, key = approver
    response = _client(key).post(
        f"/api/v1/approvals/{pending.pk}/approve/",
        {"arguments": {"order": "A1", "amount": 5000}},
        format="json",
    )
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_arguments"
    pending.refresh_from_db()
    assert pending.status == "pending" and pending.edited_arguments is None


def test_reject_needs_a_comment_and_unknown_ids_are_404(approver, pending):
    _, key = approver
    client = _client(key)
    assert (
        client.post(f"/api/v1/approvals/{pending.pk}/reject/", {}, format="json").status_code == 400
    )
    missing = client.post(f"/api/v1/approvals/{uuid.uuid4()}/approve/", {}, format="json")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    rejected = client.post(
        f"/api/v1/approvals/{pending.pk}/reject/", {"comment": "too much"}, format="json"
    )
    assert rejected.status_code == 200 and rejected.json()["comment"] == "too much"
    session_run(session_id=pending.session_id)
    assert EFFECTS == []


def test_an_approver_of_another_group_may_not_decide(pending):
    bob = api_key_create(username="bob", roles=[]).raw
    approver_grant(username="bob", groups=["managers"])
    response = _client(bob).post(f"/api/v1/approvals/{pending.pk}/approve/", {}, format="json")
    assert response.status_code == 403 and response.json()["error"]["code"] == "forbidden"
    assert _client(bob).get("/api/v1/approvals/").json() == []


def test_the_admin_approves_and_remembers(pending, admin_client):
    response = admin_client.post(
        "/admin/approvals/approval/",
        {"action": "approve_and_remember", "_selected_action": [str(pending.pk)]},
    )
    assert response.status_code == 302
    pending.refresh_from_db()
    assert pending.status == "approved" and pending.remember is True
    assert pending.decided_by_name == "admin"
    assert admin_client.get(f"/admin/approvals/approval/{pending.pk}/change/").status_code == 200


@pytest.fixture
def review(approver, pending) -> Approval:  # type: ignore[no-untyped-def]
    """A recovery review: the approved refund was sent, then the worker died (no result)."""
    from django.utils import timezone

    from record.models import ToolCall
    from tools.models import Tool

    _, key = approver
    assert (
        _client(key).post(f"/api/v1/approvals/{pending.pk}/approve/", {}, format="json").status_code
        == 200
    )
    Tool.objects.filter(name="refund").update(idempotent=False)
    ToolCall.objects.filter(pk=pending.tool_call_id).update(dispatched_at=timezone.now())
    assert session_run(session_id=pending.session_id).stopped == "idle"
    found = Approval.objects.get(session_id=pending.session_id, kind="recovery_review")
    assert found.tool_call_id == pending.tool_call_id and found.status == "pending"
    return found


def test_a_review_is_answered_over_rest_and_the_run_goes_on(approver, review):
    _, key = approver
    client = _client(key)
    listed = client.get("/api/v1/approvals/", {"status": "pending"}).json()
    assert [(r["id"], r["kind"]) for r in listed] == [(str(review.pk), "recovery_review")]
    # Approve/reject are for gated calls; a review needs an answer.
    refused = client.post(f"/api/v1/approvals/{review.pk}/approve/", {}, format="json")
    assert (refused.status_code, refused.json()["error"]["code"]) == (400, "review_needs_answer")
    bad = client.post(f"/api/v1/approvals/{review.pk}/review/", {"answer": "maybe"}, format="json")
    assert bad.status_code == 400
    stray = client.post(
        f"/api/v1/approvals/{review.pk}/review/",
        {"answer": "not_taken", "result": {"x": 1}},
        format="json",
    )
    assert stray.status_code == 400

    answered = client.post(
        f"/api/v1/approvals/{review.pk}/review/",
        {"answer": "took_effect", "result": {"refunded": 80, "order": "A1"}},
        format="json",
    )
    assert answered.status_code == 200, answered.json()
    assert (answered.json()["answer"], answered.json()["status"]) == ("took_effect", "approved")
    again = client.post(
        f"/api/v1/approvals/{review.pk}/review/", {"answer": "not_taken"}, format="json"
    )
    assert (again.status_code, again.json()["error"]["code"]) == (409, "approval_resolved")

    assert session_run(session_id=review.session_id).stopped == "idle"
    session = Session.objects.get(pk=review.session_id)
    assert session.state == "finished"
    assert EFFECTS == []  # the reviewer said it took effect: it is not sent again
    answer = Message.objects.filter(session=session, role="assistant").latest("seq")
    assert answer.content == "Refunded 80 on A1"


def test_a_key_without_approver_rights_cannot_answer_a_review(review):
    key = api_key_create(username=f"u-{uuid.uuid4().hex[:6]}", roles=["support"]).raw
    response = _client(key).post(
        f"/api/v1/approvals/{review.pk}/review/", {"answer": "send_again"}, format="json"
    )
    assert response.status_code == 403


def test_a_decision_after_the_deadline_is_409_approval_expired_and_changes_nothing(
    approver, pending
):
    """Only the sweeper applied deadlines: with beat down, an approval stayed open forever."""
    from datetime import timedelta

    from django.utils import timezone

    Approval.objects.filter(pk=pending.pk).update(deadline=timezone.now() - timedelta(seconds=1))
    _, key = approver
    late = _client(key).post(
        f"/api/v1/approvals/{pending.pk}/approve/", {"comment": "ok"}, format="json"
    )
    assert late.status_code == 409, late.content
    assert late.json()["error"]["code"] == "approval_expired"
    pending.refresh_from_db()
    assert (pending.status, pending.decided_by_name) == ("pending", "")
    assert EFFECTS == []
    assert Session.objects.get(pk=pending.session_id).state == "awaiting_approval"


def _own_pending(make_session, username: str = "alice") -> tuple[Approval, str]:  # type: ignore[no-untyped-def]
    """A pending refund in a session of `username`, who is an approver too; and their key."""
    issued = api_key_create(username=username, roles=["support"])
    approver_grant(username=username)
    session = make_session(owner=issued.api_key.owner)
    message_post(session=session, content="refund A1 80")
    session_run(session_id=session.pk)
    return Approval.objects.get(session=session), issued.raw


@pytest.mark.parametrize("decision", ["approve", "reject"])
def test_four_eyes_an_approver_cannot_decide_an_approval_of_their_own_session(
    make_session, decision
):
    approval, key = _own_pending(make_session)
    response = _client(key).post(
        f"/api/v1/approvals/{approval.pk}/{decision}/", {"comment": "mine"}, format="json"
    )
    assert response.status_code == 403, response.content
    error = response.json()["error"]
    assert error["code"] == "four_eyes" and error["details"] == {
        "session": str(approval.session_id)
    }
    approval.refresh_from_db()
    assert (approval.status, approval.decided_by_name, approval.version) == ("pending", "", 0)
    assert not approval.transitions.exists()
    assert Session.objects.get(pk=approval.session_id).state == "awaiting_approval"
    # Another approver decides it.
    other = api_key_create(username="bob", roles=[]).raw
    approver_grant(username="bob")
    decided = _client(other).post(
        f"/api/v1/approvals/{approval.pk}/{decision}/", {"comment": "checked"}, format="json"
    )
    assert decided.status_code == 200 and decided.json()["decided_by"] == "bob"


def test_four_eyes_binds_the_answer_to_a_recovery_review(review):
    owner = Session.objects.get(pk=review.session_id).owner.username
    key = api_key_create(username=owner, roles=[]).raw
    approver_grant(username=owner)
    response = _client(key).post(
        f"/api/v1/approvals/{review.pk}/review/", {"answer": "send_again"}, format="json"
    )
    assert (response.status_code, response.json()["error"]["code"]) == (403, "four_eyes")
    review.refresh_from_db()
    assert (review.status, review.answer) == ("pending", "")
    assert EFFECTS == []


def test_four_eyes_off_lets_the_sessions_owner_decide(make_session, settings):
    settings.APPROVAL_FOUR_EYES = False
    approval, key = _own_pending(make_session)
    response = _client(key).post(f"/api/v1/approvals/{approval.pk}/approve/", {}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["decided_by"] == "alice"


def test_four_eyes_leaves_the_deadline_policy_alone(make_session):
    """Expiry by the sweeper is no person's decision: it applies to the owner's session too."""
    from datetime import timedelta

    from django.utils import timezone

    from sessions.services import approvals_expire_due

    approval, _ = _own_pending(make_session)
    Approval.objects.filter(pk=approval.pk).update(deadline=timezone.now() - timedelta(seconds=1))
    assert approvals_expire_due() == [str(approval.pk)]
    approval.refresh_from_db()
    assert (approval.status, approval.decided_by_name) == ("expired", "system")
