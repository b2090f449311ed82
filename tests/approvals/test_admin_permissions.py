"""Deciding in the admin takes approver rights (as over the API) and `decide_approval`."""

import pytest
from django.test import Client
from django.urls import reverse

from accounts.services import approver_grant
from approvals.models import Approval
from engine import session_run
from record.models import Session
from sessions.services import message_post
from tests.approvals.conftest import EFFECTS
from tests.factories import StaffUserFactory, UserFactory, permissions

# The engine runs tools on helper threads with their own connections: they must see commits.
pytestmark = pytest.mark.django_db(transaction=True)
CHANGELIST = reverse("admin:approvals_approval_changelist")
QUEUE = reverse("admin:approvals_approval_queue")


# An order id no CSRF token can contain by chance (tokens are letters and digits only).
ORDER = "order_under_review"


@pytest.fixture(autouse=True)
def _no_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("record.dispatch.run_enqueue_on_commit", lambda *args: None)


@pytest.fixture
def staff():  # type: ignore[no-untyped-def]
    # The sessions' owner: approvals are tenant-scoped like the sessions they belong to.
    return StaffUserFactory(username="tenant", perms=["approvals.view_approval"])


def _pending(make_session, owner) -> Approval:  # type: ignore[no-untyped-def]
    session = make_session(owner=owner)
    message_post(session=session, content=f"refund {ORDER} 80")
    session_run(session_id=session.pk)
    assert Session.objects.get(pk=session.pk).state == "awaiting_approval"
    return Approval.objects.get(session=session)


def _client(user) -> Client:  # type: ignore[no-untyped-def]
    client = Client()
    client.force_login(user)
    return client


def test_the_approve_action_takes_approver_rights_and_the_permission(
    staff, make_session, settings
) -> None:
    # The changelist is tenant-scoped: a staff approver's actions reach only approvals of
    # their own sessions, which four eyes refuses (tests/approvals/test_four_eyes.py).
    # This test is about the permissions, so four eyes is off here alone.
    settings.APPROVAL_FOUR_EYES = False
    approval = _pending(make_session, staff)
    client = _client(staff)
    approve = {"action": "approve", "_selected_action": [approval.pk], "index": 0}
    approver_grant(username="tenant")
    # An approver with "view" alone: no action, no decision.
    assert 'value="approve"' not in client.get(CHANGELIST).content.decode()
    client.post(CHANGELIST, approve)
    approval.refresh_from_db()
    assert approval.status == "pending"

    # The permission without approver rights decides nothing either.
    outsider = StaffUserFactory(
        username="outsider", perms=["approvals.view_approval", "approvals.decide_approval"]
    )
    assert (
        _client(outsider).post(QUEUE, {"id": approval.pk, "action": "approve"}).status_code == 403
    )

    staff.user_permissions.add(*permissions("approvals.decide_approval"))
    assert 'value="approve"' in client.get(CHANGELIST).content.decode()
    client.post(CHANGELIST, approve)
    approval.refresh_from_db()
    assert (approval.status, approval.decided_by_name) == ("approved", "tenant")


def test_the_queue_decides_only_with_the_permission(staff, make_session) -> None:
    # The queue is routed by approver groups, not tenants: another user's session.
    approval = _pending(make_session, UserFactory(username="customer"))
    approver_grant(username="tenant")
    client = _client(staff)
    page = client.get(QUEUE).content.decode()
    assert "1 pending" in page and 'value="approve"' not in page
    for action in ("approve", "reject", "reject_selected", "review"):
        data = {"id": approval.pk, "ids": [approval.pk], "action": action, "answer": "not_taken"}
        assert client.post(QUEUE, data).status_code == 403
    approval.refresh_from_db()
    assert approval.status == "pending"

    staff.user_permissions.add(*permissions("approvals.decide_approval"))
    assert 'value="approve"' in client.get(QUEUE).content.decode()
    assert client.post(QUEUE, {"id": approval.pk, "action": "approve"}).status_code == 302
    approval.refresh_from_db()
    assert approval.status == "approved"
    assert session_run(session_id=approval.session_id).stopped == "idle"
    assert [e["amount"] for e in EFFECTS] == [80]


def test_the_change_page_masks_the_arguments_without_the_content_permission(
    staff, make_session
) -> None:
    approval = _pending(make_session, staff)
    client = _client(staff)
    url = reverse("admin:approvals_approval_change", args=[approval.pk])
    page = client.get(url).content.decode()
    assert ORDER not in page and "hidden: needs the view_message_content permission" in page
    staff.user_permissions.add(*permissions("agent_sessions.view_message_content"))
    assert ORDER in client.get(url).content.decode()
