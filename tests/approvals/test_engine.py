"""The engine with approvals, in process: gated calls wait, decisions resume the same step."""

from datetime import timedelta

import pytest
from django.utils import timezone
from prometheus_client import REGISTRY

from approvals.models import Approval, ApprovalTransition
from engine import session_run
from record.models import Event, Message, Session, ToolCall, Transition
from sessions.services import (
    approval_decide,
    approvals_expire_due,
    message_post,
    session_cancel,
)
from tests.approvals.conftest import EFFECTS
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db(transaction=True)


def _run(session: Session) -> Session:
    result = session_run(session_id=session.pk)
    assert result.stopped == "idle", result
    return Session.objects.get(pk=session.pk)


def _answer(session: Session) -> str:
    return Message.objects.filter(session=session, role="assistant").latest("seq").content


def test_a_gated_call_waits_without_a_worker_and_runs_once_approved(make_session, approver):
    user, _ = approver
    session = make_session()
    message_post(session=session, content="refund A1 80")
    session = _run(session)

    assert session.state == "awaiting_approval" and session.lease_owner is None
    assert EFFECTS == []
    approval = Approval.objects.get(session=session)
    assert approval.status == "pending" and approval.tool_name == "refund"
    assert approval.arguments == {"order": "A1", "amount": "80"}  # as the model sent them
    assert "condition holds" in approval.reason
    assert approval.deadline > timezone.now() + timedelta(seconds=590)
    requested = Event.objects.get(session=session, type="approval.requested").data
    assert requested["approval_id"] == str(approval.pk) and requested["tool"] == "refund"
    # A stray run (a redelivered task) finds nothing to do.
    assert session_run(session_id=session.pk).stopped == "not_acquired"
    assert EFFECTS == []

    approval_decide(approval_id=approval.pk, approve=True, user=user, groups=["approvers"])
    session = Session.objects.get(pk=session.pk)
    assert session.state == "tool_wait"
    session = _run(session)

    assert session.state == "finished"
    assert _answer(session) == "Refunded 80 on A1"
    assert [e["amount"] for e in EFFECTS] == [80]
    resolved = Event.objects.get(session=session, type="approval.resolved").data
    assert resolved == {
        "approval_id": str(approval.pk), "outcome": "approved", "by": "alice", "comment": ""
    }  # fmt: skip
    triggers = list(
        Transition.objects.filter(session=session).order_by("id").values_list("trigger", flat=True)
    )
    assert triggers == [
        "user_message",
        "tool_calls",
        "approval_needed",
        "approved",
        "tool_results",
        "model_call",
        "answer",
    ]
    approval.refresh_from_db()
    assert approval.decided_by == user and approval.decided_at is not None


def test_a_call_below_the_condition_runs_without_approval(make_session):
    session = make_session()
    message_post(session=session, content="refund A1 20")
    session = _run(session)
    assert session.state == "finished" and _answer(session) == "Refunded 20 on A1"
    assert not Approval.objects.exists()


def test_approve_with_edited_arguments_runs_exactly_once_with_the_edit(make_session, approver):
    user, _ = approver
    session = make_session()
    message_post(session=session, content="refund A1 80")
    session = _run(session)
    approval = Approval.objects.get(session=session)

    decided = approval_decide(
        approval_id=approval.pk, approve=True, user=user, groups=["approvers"],
        arguments={"order": "A1", "amount": "40"}, comment="half is enough",
    )  # fmt: skip
    assert decided.arguments == {"order": "A1", "amount": "80"}
    assert decided.edited_arguments == {"order": "A1", "amount": 40}  # coerced by the schema
    session = _run(session)
    assert session_run(session_id=session.pk).stopped == "not_acquired"  # nothing left to do

    assert [(e["order"], e["amount"]) for e in EFFECTS] == [("A1", 40)]
    assert _answer(session) == "Refunded 40 on A1"
    transition = ApprovalTransition.objects.get(approval=approval)
    assert transition.arguments == {"order": "A1", "amount": 40} and transition.actor == "alice"
    # The call's record says what ran, and keeps what the model proposed beside it.
    call = ToolCall.objects.get(session=session)
    assert call.input == {"order": "A1", "amount": 40}
    assert call.proposed_input == {"order": "A1", "amount": "80"}
    finished = Event.objects.get(session=session, type="tool.finished").data
    assert finished["input"] == {"order": "A1", "amount": 40}
    assert finished["proposed_input"] == {"order": "A1", "amount": "80"}
    assert finished["status"] == "success"
    outcome = Session.objects.get(pk=session.pk)
    assert (outcome.last_turn_outcome, outcome.last_turn_calls["ok"]) == ("ok", 1)


def test_a_call_approved_as_proposed_keeps_no_proposed_input(make_session, approver):
    user, _ = approver
    session = make_session()
    message_post(session=session, content="refund A1 80")
    session = _run(session)
    approval_decide(
        approval_id=Approval.objects.get(session=session).pk,
        approve=True,
        user=user,
        groups=["approvers"],
    )
    session = _run(session)
    call = ToolCall.objects.get(session=session)
    assert call.input == {"order": "A1", "amount": "80"} and call.proposed_input is None
    finished = Event.objects.get(session=session, type="tool.finished").data
    assert "proposed_input" not in finished and "input" not in finished


def test_a_rejected_call_never_runs_and_the_model_is_told_why(make_session, approver):
    user, _ = approver
    session = make_session()
    message_post(session=session, content="refund A1 80")
    session = _run(session)
    approval = Approval.objects.get(session=session)

    approval_decide(
        approval_id=approval.pk, approve=False, user=user, groups=["approvers"],
        comment="order already refunded",
    )  # fmt: skip
    session = _run(session)

    assert EFFECTS == []
    assert session.state == "finished"
    answer = _answer(session)
    assert answer.startswith("Not refunded: alice rejected this call")
    assert "order already refunded" in answer
    call = ToolCall.objects.get(session=session)
    assert (call.status, call.refusal) == ("rejected", "rejected")
    # The turn answered, but its call did not run: not "ok", on the event and on the row.
    finished = Event.objects.get(session=session, type="turn.finished").data
    assert finished["stop_reason"] == "answer" and finished["outcome"] == "tool_failures"
    assert finished["calls"] == {"ok": 0, "failed": 0, "rejected": 1, "expired": 0, "unpaid": 0}
    assert (session.last_turn_number, session.last_turn_outcome) == (1, "tool_failures")
    assert session.last_turn_calls == finished["calls"]
    closed = Event.objects.get(session=session, type="tool.finished").data
    assert (closed["status"], closed["refusal"]) == ("rejected", "rejected")


def test_every_call_outcome_is_counted_in_the_tool_call_metric(make_session, approver):
    """A rejected call never runs, yet it is a call outcome: agent_tool_calls_total counts it
    (before, only calls that were sent were counted: a dashboard read 100 % success)."""
    user, _ = approver

    def rejected() -> float:
        return (
            REGISTRY.get_sample_value(
                "agent_tool_calls_total", {"tool": "refund", "status": "rejected"}
            )
            or 0.0
        )

    before = rejected()
    session = make_session()
    message_post(session=session, content="refund A1 80")
    session = _run(session)
    approval_decide(
        approval_id=Approval.objects.get(session=session).pk,
        approve=False,
        user=user,
        groups=["approvers"],
        comment="no",
    )
    _run(session)
    assert rejected() == before + 1


def test_ungated_calls_of_the_response_wait_and_results_keep_the_models_order(
    make_session, approver
):
    user, _ = approver
    session = make_session()
    message_post(session=session, content="refund B2 99 and look up")
    session = _run(session)
    assert session.state == "awaiting_approval"
    assert not Message.objects.filter(session=session, role="tool").exists()

    approval = Approval.objects.get(session=session)
    approval_decide(approval_id=approval.pk, approve=True, user=user, groups=["approvers"])
    session = _run(session)

    tool_messages = list(Message.objects.filter(session=session, role="tool").order_by("seq"))
    assert [m.name for m in tool_messages] == ["lookup", "refund", "lookup"]
    assert [m.tool_call_id for m in tool_messages] == list(
        ToolCall.objects.filter(session=session)
        .order_by("position")
        .values_list("call_id", flat=True)
    )
    assert len(EFFECTS) == 1


def test_approve_and_remember_is_not_asked_again_for_the_same_arguments(make_session, approver):
    user, _ = approver
    session = make_session()
    message_post(session=session, content="refund A1 80")
    session = _run(session)
    approval = Approval.objects.get(session=session)
    approval_decide(
        approval_id=approval.pk, approve=True, user=user, groups=["approvers"], remember=True
    )
    session = _run(session)

    message_post(session=session, content="refund A1 80")
    session = _run(session)
    assert session.state == "finished" and len(EFFECTS) == 2
    message_post(session=session, content="refund A1 81")  # other arguments: asked again
    session = _run(session)
    assert session.state == "awaiting_approval"
    assert Approval.objects.filter(session=session).count() == 2


def test_approve_and_remember_stays_within_its_session(make_session, approver):
    """The remembered decision covers the session it was given in: the same owner's other
    session and another owner's session with the same tool and arguments are asked again."""
    user, _ = approver
    owner = UserFactory(username="remembering-owner")
    first = make_session(owner=owner)
    message_post(session=first, content="refund A1 80")
    first = _run(first)
    approval = Approval.objects.get(session=first)
    approval_decide(
        approval_id=approval.pk, approve=True, user=user, groups=["approvers"], remember=True
    )
    _run(first)
    assert len(EFFECTS) == 1

    for other in (make_session(owner=owner), make_session(owner=UserFactory(username="stranger"))):
        message_post(session=other, content="refund A1 80")
        other = _run(other)
        assert other.state == "awaiting_approval"
        assert Approval.objects.get(session=other).status == "pending"
    assert len(EFFECTS) == 1


def test_the_deadline_rejects_by_default_and_the_model_is_told(make_session):
    session = make_session()
    message_post(session=session, content="refund A1 80")
    session = _run(session)
    approval = Approval.objects.get(session=session)
    assert approvals_expire_due() == []
    Approval.objects.filter(pk=approval.pk).update(deadline=timezone.now() - timedelta(seconds=1))

    assert approvals_expire_due() == [str(approval.pk)]
    assert approvals_expire_due() == []
    session = _run(session)

    assert EFFECTS == []
    approval.refresh_from_db()
    assert approval.status == "expired" and approval.decided_by_name == "system"
    assert "before its deadline" in _answer(session)
    assert ToolCall.objects.get(session=session).refusal == "expired"
    assert (session.last_turn_outcome, session.last_turn_calls["expired"]) == ("tool_failures", 1)
    resolved = Event.objects.get(session=session, type="approval.resolved").data
    assert resolved["outcome"] == "expired" and resolved["by"] == "system"


def test_the_deadline_can_approve(make_session, refund_tool):
    refund_tool.approval_on_timeout = "approve"
    refund_tool.save()
    session = make_session()
    message_post(session=session, content="refund A1 80")
    session = _run(session)
    Approval.objects.filter(session=session).update(deadline=timezone.now() - timedelta(seconds=1))
    approvals_expire_due()
    session = _run(session)
    assert [e["amount"] for e in EFFECTS] == [80]
    assert _answer(session) == "Refunded 80 on A1"


def test_the_deadline_escalates_once_then_expires(make_session, refund_tool, approver):
    user, _ = approver
    refund_tool.approval_on_timeout = "escalate"
    refund_tool.approval_escalate_to = "managers"
    refund_tool.save()
    session = make_session()
    message_post(session=session, content="refund A1 80")
    session = _run(session)
    approval = Approval.objects.get(session=session)
    Approval.objects.filter(pk=approval.pk).update(deadline=timezone.now() - timedelta(seconds=1))

    approvals_expire_due()
    approval.refresh_from_db()
    assert approval.status == "pending" and approval.group == "managers"
    assert approval.deadline > timezone.now() + timedelta(seconds=590)
    assert Session.objects.get(pk=session.pk).state == "awaiting_approval"
    types = list(
        Event.objects.filter(session=session, type__startswith="approval.")
        .order_by("seq")
        .values_list("type", "data__outcome")
    )
    assert types == [
        ("approval.requested", None),
        ("approval.resolved", "escalated"),
        ("approval.requested", None),
    ]
    # The default group may no longer decide it.
    from record.errors import Forbidden

    with pytest.raises(Forbidden):
        approval_decide(approval_id=approval.pk, approve=True, user=user, groups=["approvers"])

    Approval.objects.filter(pk=approval.pk).update(deadline=timezone.now() - timedelta(seconds=1))
    approvals_expire_due()
    approval.refresh_from_db()
    assert approval.status == "expired"
    assert _run(session).state == "finished" and EFFECTS == []


def test_cancel_closes_pending_approvals(make_session, approver):
    user, _ = approver
    session = make_session()
    message_post(session=session, content="refund A1 80")
    session = _run(session)
    assert session_cancel(session=session, actor="bob") is True

    session = Session.objects.get(pk=session.pk)
    assert session.state == "cancelled"
    approval = Approval.objects.get(session=session)
    assert approval.status == "cancelled"
    from record.errors import Conflict

    with pytest.raises(Conflict) as refused:
        approval_decide(approval_id=approval.pk, approve=True, user=user, groups=["approvers"])
    assert refused.value.code == "approval_resolved"
    assert EFFECTS == []


def _failures(session: Session, tool: str, count: int) -> None:
    ToolCall.objects.bulk_create(
        [
            ToolCall(
                session=session, turn=0, step=0, position=i, call_id=f"old{i}", tool_name=tool,
                status="failed", error="upstream down", idempotency_key=f"old-{session.pk}-{i}",
            )
            for i in range(count)
        ]
    )  # fmt: skip


def test_an_assessed_level_2_call_runs_after_a_pre_run_checkpoint(make_session, refund_tool):
    from record.models import Checkpoint

    refund_tool.approval_when = None
    refund_tool.save()
    session = make_session()
    message_post(session=session, content="refund A1 20")
    session = _run(session)

    assert session.state == "finished" and not Approval.objects.filter(session=session).exists()
    call = ToolCall.objects.get(session=session)
    assert (call.risk_level, call.risk_reason) == (2, "side effect with money-like amount")
    [pre_run] = [
        c.context["pre_run"]
        for c in Checkpoint.objects.filter(session=session)
        if "pre_run" in c.context
    ]
    assert pre_run[0]["idempotency_key"] == call.idempotency_key and pre_run[0]["risk_level"] == 2


def test_a_tool_that_failed_often_lately_goes_to_level_3_and_asks_a_person(
    make_session, refund_tool, approver
):
    user, _ = approver
    refund_tool.approval_when = None
    refund_tool.save()
    _failures(make_session(), "refund", 4)
    session = make_session()
    message_post(session=session, content="refund A1 20")
    session = _run(session)

    assert session.state == "awaiting_approval" and EFFECTS == []
    approval = Approval.objects.get(session=session)
    assert approval.risk_level == 3
    assert approval.reason == (
        "refund has risk level 3 (side effect with money-like amount; "
        "+1: 4 of its last 4 calls failed)"
    )
    requested = Event.objects.get(session=session, type="approval.requested").data
    assert requested["risk_level"] == 3
    approval_decide(approval_id=approval.pk, approve=True, user=user, groups=["approvers"])
    session = _run(Session.objects.get(pk=session.pk))
    assert session.state == "finished" and [e["amount"] for e in EFFECTS] == [20]
