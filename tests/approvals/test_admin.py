"""The approvers' queue in the admin: their home page, one-click decisions, bulk reject, reviews."""

import json

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.urls import reverse

from accounts.services import approver_grant
from approvals.admin import arguments_diff, time_left
from approvals.models import Approval
from engine import session_run
from record.models import Session
from sessions.services import message_post
from tests.approvals.conftest import EFFECTS

pytestmark = pytest.mark.django_db(transaction=True)
QUEUE = "/admin/approvals/approval/queue/"


@pytest.fixture(autouse=True)
def _no_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("record.dispatch.run_enqueue_on_commit", lambda *args: None)


def _pending(make_session, content: str = "refund A1 80", **fields) -> Session:  # type: ignore[no-untyped-def]
    session = make_session(**fields)
    message_post(session=session, content=content)
    assert session_run(session_id=session.pk).stopped == "idle"
    session = Session.objects.get(pk=session.pk)
    assert session.state == "awaiting_approval"
    return session


@pytest.fixture
def operator(client):  # type: ignore[no-untyped-def]
    user = get_user_model().objects.create_superuser("op", "op@example.com", "pw-not-used")
    client.force_login(user)
    return user


@pytest.fixture
def approver_only(client):  # type: ignore[no-untyped-def]
    """A staff user with no model permissions who approves for the 'managers' group."""
    user = get_user_model().objects.create_user("bob", password="pw-not-used", is_staff=True)
    approver_grant(username="bob", groups=["managers"])
    client.force_login(user)
    return user


def test_the_queue_shows_each_pending_call_with_its_context_and_approves_in_one_click(
    client, operator, make_session
):
    session = _pending(make_session)
    page = client.get(QUEUE)
    assert page.status_code == 200
    html = page.content.decode()
    assert "1 pending" in html and "refund" in html and "risk" in html
    assert "refund A1 80" in html  # the session's recent messages
    approval = Approval.objects.get(session=session)

    response = client.post(QUEUE, {"id": approval.pk, "action": "approve", "comment": ""})
    assert response.status_code == 302
    approval.refresh_from_db()
    assert (approval.status, approval.decided_by_name) == ("approved", "op")
    assert Session.objects.get(pk=session.pk).state == "tool_wait"
    assert session_run(session_id=session.pk).stopped == "idle"
    assert [e["amount"] for e in EFFECTS] == [80]
    assert "0 pending" in client.get(QUEUE).content.decode()


def test_edited_arguments_are_validated_and_shown_as_a_diff(client, operator, make_session):
    session = _pending(make_session)
    approval = Approval.objects.get(session=session)
    bad = {"id": approval.pk, "action": "approve", "arguments": '{"order": "A1", "amount": 5000}'}
    client.post(QUEUE, bad)
    approval.refresh_from_db()
    assert approval.status == "pending"  # 5000 is above the schema's maximum

    edited = json.dumps({"order": "A1", "amount": 40})
    client.post(QUEUE, {"id": approval.pk, "action": "approve", "arguments": edited})
    approval.refresh_from_db()
    assert (approval.status, approval.edited_arguments) == (
        "approved",
        {"order": "A1", "amount": 40},
    )
    html = client.get(QUEUE).content.decode()
    assert "<del>&quot;80&quot;</del> → <ins>40</ins>" in html


def test_bulk_reject_rejects_the_selected_with_the_comment(client, operator, make_session):
    first, second, third = (_pending(make_session) for _ in range(3))
    ids = [Approval.objects.get(session=s).pk for s in (first, second)]
    client.post(QUEUE, {"action": "reject_selected", "ids": ids, "comment": "fraud wave"})
    statuses = {a.session_id: (a.status, a.comment) for a in Approval.objects.all()}
    assert statuses[first.pk] == statuses[second.pk] == ("rejected", "fraud wave")
    assert statuses[third.pk] == ("pending", "")


def test_an_approver_who_is_not_an_operator_sees_only_the_queue_of_their_groups(
    client, approver_only, make_session, refund_tool
):
    mine = _pending(make_session)
    Approval.objects.filter(session=mine).update(group="managers")
    _pending(make_session)  # the default group's: not bob's
    index = client.get("/admin/")
    assert index.status_code == 302 and index.url == QUEUE
    html = client.get(QUEUE).content.decode()
    assert "1 pending" in html and str(mine.pk)[:8] in html
    assert client.get(reverse("admin:agent_sessions_session_changelist")).status_code == 403

    approval = Approval.objects.get(session=mine)
    # Approver rights show the queue; deciding in the admin takes the permission too.
    assert 'value="reject"' not in html
    assert client.post(QUEUE, {"id": approval.pk, "action": "reject"}).status_code == 403
    approval.refresh_from_db()
    assert approval.status == "pending"

    approver_only.user_permissions.add(Permission.objects.get(codename="decide_approval"))
    assert client.get("/admin/").url == QUEUE  # still an approver, not an operator
    client.post(QUEUE, {"id": approval.pk, "action": "reject", "comment": "no"})
    approval.refresh_from_db()
    assert (approval.status, approval.decided_by_name) == ("rejected", "bob")


def test_a_staff_user_who_is_not_an_approver_cannot_open_the_queue(client):
    user = get_user_model().objects.create_user("carol", password="pw", is_staff=True)
    client.force_login(user)
    assert client.get(QUEUE).status_code == 403
    assert client.get("/admin/").status_code == 200


def test_the_operators_index_links_the_queue_with_its_count(client, operator, make_session):
    _pending(make_session)
    html = client.get("/admin/").content.decode()
    assert "Approvals queue" in html and "1 pending" in html


FOUR_EYES = "another approver must decide it (four-eyes rule)"


def test_four_eyes_the_queue_refuses_a_superusers_decision_on_their_own_session(
    client, operator, make_session
):
    approval = Approval.objects.get(session=_pending(make_session, owner=operator))
    page = client.get(QUEUE).content.decode()
    assert "1 pending" in page and "another approver decides it (four eyes)" in page
    assert 'value="approve"' not in page and 'name="ids"' not in page
    for action in ("approve", "reject", "reject_selected"):
        data = {"id": approval.pk, "ids": [approval.pk], "action": action, "comment": "mine"}
        answer = client.post(QUEUE, data, follow=True).content.decode()
        assert FOUR_EYES in answer, action
    approval.refresh_from_db()
    assert (approval.status, approval.decided_by_name) == ("pending", "")
    assert not approval.transitions.exists() and EFFECTS == []

    # Another operator decides it.
    other = get_user_model().objects.create_superuser("op2", "op2@example.com", "pw-not-used")
    client.force_login(other)
    assert 'value="approve"' in client.get(QUEUE).content.decode()
    client.post(QUEUE, {"id": approval.pk, "action": "approve"})
    approval.refresh_from_db()
    assert (approval.status, approval.decided_by_name) == ("approved", "op2")


def test_four_eyes_the_queue_refuses_an_approvers_decision_on_their_own_session(
    client, approver_only, make_session
):
    approver_only.user_permissions.add(Permission.objects.get(codename="decide_approval"))
    approval = Approval.objects.get(session=_pending(make_session, owner=approver_only))
    Approval.objects.filter(pk=approval.pk).update(group="managers")
    answer = client.post(QUEUE, {"id": approval.pk, "action": "approve"}, follow=True)
    assert FOUR_EYES in answer.content.decode()
    approval.refresh_from_db()
    assert approval.status == "pending" and EFFECTS == []


@pytest.mark.parametrize("action", ["approve", "approve_and_remember", "reject"])
def test_four_eyes_the_admin_actions_refuse_a_decision_on_the_deciders_own_session(
    client, operator, make_session, action
):
    approval = Approval.objects.get(session=_pending(make_session, owner=operator))
    changelist = reverse("admin:approvals_approval_changelist")
    answer = client.post(
        changelist, {"action": action, "_selected_action": [approval.pk], "index": 0}, follow=True
    )
    assert FOUR_EYES in answer.content.decode()
    approval.refresh_from_db()
    assert (approval.status, approval.remember) == ("pending", False)
    assert not approval.transitions.exists()


def test_arguments_diff():
    assert arguments_diff({"a": 1, "b": 2}, {"a": 1, "b": 3, "c": None}) == [
        ("b", "2", "3"),
        ("c", "(absent)", "null"),
    ]


def test_a_decision_is_withdrawn_or_changed_from_the_queue_until_its_call_runs(
    client, operator, make_session
):
    session = _pending(make_session)
    approval = Approval.objects.get(session=session)
    client.post(QUEUE, {"id": approval.pk, "action": "approve"})
    row = client.get(QUEUE).content.decode().split(f'id="decided-{approval.pk}"')[1]
    assert 'value="withdraw"' in row.split("</tr>")[0] and "Reject instead" in row

    client.post(QUEUE, {"id": approval.pk, "action": "withdraw", "comment": "let me look"})
    approval.refresh_from_db()
    assert approval.status == "pending"
    assert Session.objects.get(pk=session.pk).state == "awaiting_approval"
    client.post(QUEUE, {"id": approval.pk, "action": "approve"})
    client.post(QUEUE, {"id": approval.pk, "action": "change", "comment": "on second thought"})
    approval.refresh_from_db()
    assert (approval.status, approval.comment) == ("rejected", "on second thought")

    session_run(session_id=session.pk)  # the call is closed as rejected: the decision stands
    page = client.get(QUEUE).content.decode()
    row = page.split(f'id="decided-{approval.pk}"')[1].split("</tr>")[0]
    assert 'value="withdraw"' not in row
    late = client.post(QUEUE, {"id": approval.pk, "action": "withdraw"}, follow=True)
    assert "has started" in late.content.decode()
    assert Approval.objects.get(pk=approval.pk).status == "rejected" and EFFECTS == []


def test_the_approval_list_withdraws_and_changes_decisions(client, operator, make_session):
    session = _pending(make_session)
    approval = Approval.objects.get(session=session)
    url = reverse("admin:approvals_approval_changelist")
    client.post(url, {"action": "approve", "_selected_action": [approval.pk]})
    client.post(url, {"action": "change_decision", "_selected_action": [approval.pk]})
    approval.refresh_from_db()
    assert approval.status == "rejected" and approval.comment == "changed in the admin by op"
    client.post(url, {"action": "withdraw_decision", "_selected_action": [approval.pk]})
    assert Approval.objects.get(pk=approval.pk).status == "pending"
    moves = list(approval.transitions.values_list("outcome", flat=True))
    assert moves == ["approved", "rejected", "withdrawn"]


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [(-3, "overdue"), (0, "overdue"), (6, "6s left"), (119, "119s left"), (120, "2m left"),
     (3599, "59m left"), (3900, "1h 5m left")],
)  # fmt: skip
def test_a_deadline_reads_in_seconds_when_under_two_minutes(seconds, shown):
    assert time_left(seconds) == shown


def test_a_refused_edit_keeps_what_was_typed_with_the_reason(client, operator, make_session):
    session = _pending(make_session)
    approval = Approval.objects.get(session=session)
    typed = '{"order": "A1", "amount": 5000, "note": "typed by hand"}'
    page = client.post(
        QUEUE, {"id": approval.pk, "action": "approve", "arguments": typed, "comment": "ok"}
    )
    html = page.content.decode()
    assert page.status_code == 400
    card = html.split(f'id="approval-{approval.pk}"')[1]
    assert "Not approved: the edited arguments do not match the schema of refund" in card
    assert "typed by hand" in card and "<details open>" in card and 'value="ok"' in card
    assert Approval.objects.get(pk=approval.pk).status == "pending"

    broken = client.post(QUEUE, {"id": approval.pk, "action": "approve", "arguments": "{nope"})
    assert broken.status_code == 400 and "{nope" in broken.content.decode()
    assert "not valid JSON" in broken.content.decode()


def test_the_approver_reads_the_conversation_not_only_the_last_message(
    client, operator, make_session
):
    session = make_session()
    message_post(session=session, content="refund A1 20")  # under 50: no approval
    session_run(session_id=session.pk)
    message_post(session=session, content="refund A2 80")
    session_run(session_id=session.pk)
    assert Session.objects.get(pk=session.pk).state == "awaiting_approval"
    html = client.get(QUEUE).content.decode()
    card = html.split('aria-label="Recent messages"')[1].split("</ul>")[0]
    lines = [line.split("</li>")[0] for line in card.split("<li")[1:]]
    assert len(lines) == 6
    assert "refund A1 20" in lines[0]  # the earlier turn, in order
    assert "→ refund" in lines[1]  # what the assistant asked for
    assert "refund result" in lines[2] and "refunded" in lines[2]  # and what came back
    assert "Refunded 20 on A1" in lines[3]
    assert "refund A2 80" in lines[4] and "→ refund" in lines[5]


def test_without_the_content_or_decide_permission_the_conversation_is_hidden(
    client, approver_only, make_session
):
    _pending(make_session, content="refund A1 80 secret-words")
    Approval.objects.update(group="managers")
    html = client.get(QUEUE).content.decode()
    assert "secret-words" not in html and "The conversation is hidden" in html
    approver_only.user_permissions.add(Permission.objects.get(codename="decide_approval"))
    assert "secret-words" in client.get(QUEUE).content.decode()
