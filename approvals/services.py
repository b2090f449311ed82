"""Writes of approvals: request them, resolve them exactly once, cancel them.

The session side of each move (its state, the events on its stream) is the
engine's; these functions run inside the caller's transaction, and announce
to approvers (websocket, webhook) only after it commits.
"""

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from record.errors import InvalidInput
from record.models import ToolCall
from tools.execution import ToolSnapshot, validator_for
from tools.validation import check_arguments

from .models import DEFAULT_GROUP, Approval, ApprovalKind, ApprovalTransition
from .notify import announce_on_commit
from .states import ApprovalStatus, Outcome, approval_next

SYSTEM_ACTOR = "system"


def approval_request(
    *,
    call: ToolCall,
    tool: ToolSnapshot,
    reason: str,
    now: datetime,
    kind: str = ApprovalKind.TOOL_CALL,
) -> Approval:
    """An approval for one gated call (or a review of an uncertain one), not yet saved
    (`approvals_insert` saves the step's)."""
    return Approval(
        session_id=call.session_id,
        tool_call_id=call.pk,
        kind=kind,
        turn=call.turn,
        step=call.step,
        tool_name=tool.name,
        arguments=call.input if isinstance(call.input, dict) else {},
        risk_level=tool.risk_level if call.risk_level is None else call.risk_level,
        reason=reason,
        on_timeout=tool.approval_on_timeout,
        group=tool.approval_group or DEFAULT_GROUP,
        escalate_to=tool.approval_escalate_to,
        timeout_s=tool.approval_timeout_s,
        requested_at=now + timedelta(microseconds=call.position),  # keeps the model's order
        deadline=now + timedelta(seconds=tool.approval_timeout_s),
    )


def approvals_insert(*, approvals: list[Approval]) -> None:
    """Save a step's approvals (in the step's transaction) and tell approvers after commit."""
    if not approvals:
        return
    Approval.objects.bulk_create(approvals)
    announce_on_commit([("approval.requested", a) for a in approvals])


def approval_arguments_check(
    *, approval: Approval, tool: ToolSnapshot | None, arguments: Any
) -> dict[str, Any]:
    """Edited arguments, validated against the tool's schema again (InvalidInput: 400)."""
    if tool is None:
        raise InvalidInput(
            f"tool {approval.tool_name} no longer exists; approve without edits or reject",
            details={"field": "arguments"},
        )
    checked = check_arguments(validator_for(tool), arguments)
    if checked.errors:
        raise InvalidInput(
            f"the edited arguments do not match the schema of {tool.name}: {'; '.join(checked.errors)}",
            details={"field": "arguments", "errors": checked.errors},
            code="invalid_arguments",
        )
    return dict(checked.arguments)


@dataclass(frozen=True)
class Decision:
    """What moves a pending approval: the outcome, who decides, and what comes with it."""

    outcome: Outcome
    actor: str
    user: User | None = None
    comment: str = ""
    edited_arguments: dict[str, Any] | None = None
    remember: bool = False
    escalate_to: str = ""  # ESCALATED: the group, with a fresh `deadline`
    deadline: datetime | None = None
    answer: str = ""  # a recovery review's answer, and the result a took_effect carries
    answer_result: Any = None
    within_deadline: bool = False  # a person's decision: not once the deadline has passed


def approval_resolve(*, approval: Approval, decision: Decision) -> Approval | None:
    """Move a pending approval, or return None if someone (or the deadline) got there first.

    One conditional UPDATE on (id, status pending, version): of two racing
    deciders exactly one changes the row; the other learns it was too late. A
    person's decision (`within_deadline`) also needs the deadline not passed: the
    sweeper's expiry must not be the only thing that enforces it.
    """
    d = decision
    to_status = approval_next(ApprovalStatus.PENDING, d.outcome)
    now = timezone.now()
    in_time = Q(deadline__isnull=True) | Q(deadline__gt=now) if d.within_deadline else Q()
    fields: dict[str, Any] = {"status": to_status.value, "version": F("version") + 1}
    if d.outcome == Outcome.ESCALATED:
        fields.update(group=d.escalate_to, deadline=d.deadline, escalations=F("escalations") + 1)
    else:
        fields.update(
            decided_by=d.user, decided_by_name=d.actor[:150], decided_at=now, comment=d.comment
        )
        if d.edited_arguments is not None:
            fields["edited_arguments"] = d.edited_arguments
        if d.remember:
            fields["remember"] = True
        if d.answer:
            fields.update(answer=d.answer, answer_result=d.answer_result)
    changed = Approval.objects.filter(
        in_time, pk=approval.pk, status=ApprovalStatus.PENDING, version=approval.version
    ).update(**fields)
    if changed != 1:
        return None
    fresh = Approval.objects.get(pk=approval.pk)
    ApprovalTransition.objects.create(
        approval=fresh,
        from_status=ApprovalStatus.PENDING.value,
        to_status=to_status.value,
        outcome=d.outcome.value,
        actor=d.actor[:150],
        user=d.user,
        comment=d.comment,
        arguments=d.edited_arguments,
        group=fresh.group,
        version=fresh.version,
    )
    announce_on_commit([("approval.resolved", fresh)], outcome=d.outcome.value, by=d.actor)
    if d.outcome == Outcome.ESCALATED:
        announce_on_commit([("approval.requested", fresh)])
    return fresh


def approval_change(
    *,
    approval: Approval,
    outcome: Outcome,
    actor: str,
    user: User | None = None,
    comment: str = "",
    edited_arguments: dict[str, Any] | None = None,
) -> Approval | None:
    """Withdraw a decision (`withdrawn`: pending again, with a fresh deadline) or change it
    (approved <-> rejected), or return None if the approval moved meanwhile.

    One conditional UPDATE on (id, the decided status, version), as a decision: of two
    people changing one approval at once exactly one gets a row back. Whether the call
    has started is the caller's to check, under the session's row lock
    (sessions/services/approvals.py `approval_change`).
    """
    current = ApprovalStatus(approval.status)
    to_status = approval_next(current, outcome)
    now = timezone.now()
    fields: dict[str, Any] = {
        "status": to_status.value,
        "version": F("version") + 1,
        "remember": False,
        "edited_arguments": edited_arguments,
    }
    if outcome == Outcome.WITHDRAWN:
        fields.update(
            decided_by=None,
            decided_by_name="",
            decided_at=None,
            comment="",
            deadline=now + timedelta(seconds=approval.timeout_s),
        )
    else:
        fields.update(decided_by=user, decided_by_name=actor[:150], decided_at=now, comment=comment)
    changed = Approval.objects.filter(
        pk=approval.pk, status=current.value, version=approval.version
    ).update(**fields)
    if changed != 1:
        return None
    fresh = Approval.objects.get(pk=approval.pk)
    ApprovalTransition.objects.create(
        approval=fresh,
        from_status=current.value,
        to_status=to_status.value,
        outcome=outcome.value,
        actor=actor[:150],
        user=user,
        comment=comment,
        arguments=edited_arguments,
        group=fresh.group,
        version=fresh.version,
    )
    announce_on_commit(
        [("approval.resolved", fresh)], outcome=outcome.value, by=actor, previous=current.value
    )
    if outcome == Outcome.WITHDRAWN:
        announce_on_commit([("approval.requested", fresh)])
    return fresh


def approvals_cancel(*, session_id: UUID | str, actor: str, reason: str) -> list[Approval]:
    """Close a session's pending approvals (its turn was cancelled): none of them runs."""
    closed: list[Approval] = []
    with transaction.atomic(savepoint=False):
        for approval in Approval.objects.filter(
            session_id=session_id, status=ApprovalStatus.PENDING
        ):
            done = approval_resolve(
                approval=approval,
                decision=Decision(Outcome.CANCELLED, actor or SYSTEM_ACTOR, comment=reason),
            )
            if done is not None:
                closed.append(done)
    return closed
