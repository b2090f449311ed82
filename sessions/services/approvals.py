"""Decisions on approvals and recovery reviews (REST, the admin, the sweeper's expiry): the
four-eyes rule, the deadline, and the move each decision causes; a decision withdrawn or
changed while its call has not started.
"""

import logging
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.db.models.functions import Now
from django.utils import timezone

from approvals.models import Approval, ApprovalKind, ReviewAnswer
from approvals.policy import four_eyes_forbids
from approvals.selectors import approval_get, approval_pending_exists, approvals_due
from approvals.services import (
    SYSTEM_ACTOR,
    Decision,
    approval_arguments_check,
    approval_resolve,
)
from approvals.services import (
    approval_change as approval_change_row,
)
from approvals.states import CHANGEABLE, UNDO_HOLD, Outcome
from audit.diff import changes
from audit.models import AuditAction
from audit.services import audit_record
from engine import (
    approval_changed,
    approval_recorded,
)
from record import dispatch
from record.errors import Conflict, Forbidden, InvalidInput, NotFound
from record.models import (
    Session,
    ToolCall,
    ToolCallStatus,
)
from record.states import State
from tools.execution import tools_for_agent
from workflows.node_tools import REVIEW_PREFIX

logger = logging.getLogger(__name__)


def _approval_apply(
    *, approval: Approval, decision: Decision, key_prefix: str = ""
) -> Approval | None:
    """Resolve one approval and record it on its session, in one short transaction.

    The session row is locked first (decisions on one session's approvals
    queue behind each other), then the approval moves by a conditional
    UPDATE: of two racing deciders exactly one gets a row back. When the
    step has nothing pending any more, the session goes back to `tool_wait`
    and a worker is woken after commit. The decision's audit entry commits with it.
    """
    with transaction.atomic():
        locked = Session.objects.locked().get(pk=approval.session_id)
        resolved = approval_resolve(approval=approval, decision=decision)
        if resolved is None:
            return None
        _decision_audit(
            approval=resolved,
            outcome=decision.outcome,
            actor=decision.actor,
            user=decision.user,
            owner_id=locked.owner_id,
            key_prefix=key_prefix,
            reason=decision.comment,
        )
        if State(locked.state) == State.AWAITING_APPROVAL:
            resume = not approval_pending_exists(session_id=locked.pk)
            # A person's decision on a call (not the deadline's, not a recovery review's
            # answer) may be undone for a while: the run goes on after that.
            undo_s = (
                settings.APPROVAL_UNDO_S
                if decision.user is not None
                and not decision.answer
                and approval.kind == ApprovalKind.TOOL_CALL
                else 0.0
            )
            approval_recorded(
                session=locked,
                approval=resolved,
                outcome=decision.outcome,
                by=decision.actor,
                resume=resume,
                undo_s=undo_s,
            )
            if resume:
                dispatch.run_enqueue_on_commit(locked.pk, locked.value, undo_s)
    return resolved


def _decision_audit(
    *,
    approval: Approval,
    outcome: Outcome,
    actor: str,
    user: User | None,
    owner_id: int | None,
    key_prefix: str = "",
    reason: str = "",
) -> None:
    """The audit entry of a decision: a person's (approve, edit, reject, a review's answer)
    or the deadline policy's (the system's, in a person's place)."""
    before: dict[str, Any] | None = None
    after: dict[str, Any] | None = None
    if actor == SYSTEM_ACTOR:
        action = AuditAction.APPROVAL_EXPIRED
    elif approval.answer:
        action = AuditAction.REVIEW_ANSWERED
    elif outcome == Outcome.APPROVED and approval.edited_arguments is not None:
        action = AuditAction.APPROVAL_EDITED
        before, after = {"arguments": approval.arguments}, {"arguments": approval.edited_arguments}
    elif outcome == Outcome.APPROVED:
        action = AuditAction.APPROVAL_APPROVED
    else:
        action = AuditAction.APPROVAL_REJECTED
    data: dict[str, Any] = {
        "tool": approval.tool_name,
        "session": str(approval.session_id),
        "outcome": outcome.value,
        "status": approval.status,
    }
    if approval.remember:
        data["remember"] = True
    if approval.answer:
        data["answer"] = approval.answer
    if actor == SYSTEM_ACTOR:
        data["policy"] = approval.on_timeout
    if before is not None:
        before, after = changes(before, after)
    if user is not None:
        # A key decides over the API; without one, a person decided in the admin.
        actor = f"{'api' if key_prefix else 'admin'}:{user.get_username()}"
    audit_record(
        action=action,
        actor=actor,
        user_id=user.pk if user is not None else None,
        key_prefix=key_prefix,
        object_type=Approval._meta.label_lower,
        object_id=approval.pk,
        object_repr=f"{approval.tool_name} ({approval.kind.replace('_', ' ')})",
        owner_id=owner_id,
        before=before,
        after=after,
        reason=reason,
        data=data,
    )


def approval_decide(
    *,
    approval_id: UUID | str,
    approve: bool,
    user: User,
    groups: list[str],
    comment: str = "",
    arguments: dict[str, Any] | None = None,
    remember: bool = False,
    key_prefix: str = "",
) -> Approval:
    """An approver's decision: approve (maybe with edited arguments), or reject with a comment.

    403 if the approval is not for one of the approver's groups, 403 `four_eyes` if the
    approver owns the approval's session, 400 if edited arguments fail the tool's schema,
    409 `approval_resolved` if it is no longer pending (another approver or the deadline
    was first).
    """
    approval = _approvers_approval(approval_id=approval_id, user=user, groups=groups)
    if approval.status != "pending":
        raise _resolved_conflict(approval)
    if approval.kind == ApprovalKind.RECOVERY_REVIEW and approve:
        raise InvalidInput(
            "this is a recovery review: answer whether the call took effect "
            f"(POST .../review/ with answer {', '.join(ReviewAnswer.values)})",
            code="review_needs_answer",
        )
    edited = None
    if approve and arguments is not None:
        edited = _edited_arguments(approval, arguments)
    resolved = _approval_apply(
        approval=approval,
        decision=Decision(
            Outcome.APPROVED if approve else Outcome.REJECTED,
            user.get_username(),
            user=user,
            comment=comment,
            edited_arguments=edited,
            remember=remember and approve,
            within_deadline=True,
        ),
        key_prefix=key_prefix,
    )
    if resolved is None:
        fresh = approval_get(approval_id=approval.pk)
        raise _resolved_conflict(fresh or approval)
    return resolved


CHANGES = {
    "pending": Outcome.WITHDRAWN,
    "approved": Outcome.APPROVED,
    "rejected": Outcome.REJECTED,
}


def approval_change(
    *,
    approval_id: UUID | str,
    decision: str,
    user: User,
    groups: list[str],
    comment: str = "",
    arguments: dict[str, Any] | None = None,
    key_prefix: str = "",
) -> Approval:
    """Withdraw a decision (`decision` "pending": the call waits for a person again, with a
    fresh deadline) or change it ("approved" <-> "rejected"), while its call has not started.

    The same rights as deciding (the group, four eyes; edited arguments re-validated).
    Under the session's row lock, then the call's: 409 `call_started` once the run has
    gone past the decision (another turn or state, a worker holding the run, the call
    sent or finished); a decision is changed only from approved or rejected (409
    `approval_not_changeable` for a pending, expired or cancelled one, or a review's
    answer). The session records it (`approval.resolved` with `previous`; a withdrawal
    asks again with `approval.requested`), the version moves so a step begun on the old
    decision cannot commit on it, and the audit trail has it, in one transaction.
    """
    if decision not in CHANGES:
        raise InvalidInput(
            f"decision must be one of {', '.join(CHANGES)}", details={"field": "decision"}
        )
    approval = _approvers_approval(approval_id=approval_id, user=user, groups=groups)
    _changeable_check(approval)
    if decision == approval.status:
        raise InvalidInput(f"approval {approval.pk} is already {decision}", code="unchanged")
    outcome = CHANGES[decision]
    edited = None
    if outcome == Outcome.APPROVED and arguments is not None:
        edited = _edited_arguments(approval, arguments)
    actor = user.get_username()
    with transaction.atomic():
        # The database's clock, as the undo window's lease was set by it.
        locked = Session.objects.locked().annotate(db_now=Now()).get(pk=approval.session_id)
        call = (
            ToolCall.objects.select_for_update().filter(pk=approval.tool_call_id).first()
            if approval.tool_call_id
            else None
        )
        started = call_started(session=locked, approval=approval, call=call, now=locked.db_now)
        if started is not None:
            ran_at = _ran_at(session=locked, approval=approval, call=call)
            raise Conflict(
                f"the call of approval {approval.pk} has started ({started}"
                + (f", at {ran_at.isoformat()}" if ran_at else "")
                + "); its decision stands",
                details={
                    "reason": started,
                    "ran_at": ran_at.isoformat() if ran_at else None,
                    "state": locked.state,
                    "call_status": call.status if call is not None else None,
                },
                code="call_started",
            )
        previous = approval.status
        changed = approval_change_row(
            approval=approval,
            outcome=outcome,
            actor=actor,
            user=user,
            comment=comment,
            edited_arguments=edited,
        )
        if changed is None:
            fresh = approval_get(approval_id=approval.pk)
            raise Conflict(
                f"approval {approval.pk} changed meanwhile; it is now {(fresh or approval).status}",
                details={"status": (fresh or approval).status},
                code="approval_resolved",
            )
        approval_changed(
            session=locked, approval=changed, outcome=outcome, previous=previous, by=actor
        )
        _change_audit(
            approval=changed,
            previous=previous,
            before_arguments=approval.edited_arguments,
            user=user,
            owner_id=locked.owner_id,
            key_prefix=key_prefix,
            reason=comment,
        )
        if State(locked.state) == State.TOOL_WAIT:
            dispatch.run_enqueue_on_commit(locked.pk, locked.value)
    return changed


def call_started(
    *, session: Session, approval: Approval, call: ToolCall | None, now: datetime
) -> str | None:
    """Why the approval's call can no longer be held back (None: it has not started).

    Read under the session's row lock: a worker takes the run by a conditional UPDATE of
    that row, so a run nobody holds now cannot start before the change commits, and the
    change moves the version, so a step that read the old decision cannot commit on it.
    The decision's undo window (a lease held in UNDO_HOLD's name) is open until its lease
    runs out by `now`, the database's clock: a worker takes the run from then on.
    """
    if session.turn != approval.turn:
        return "the session has gone on to another turn"
    if State(session.state) not in (State.AWAITING_APPROVAL, State.TOOL_WAIT):
        return f"the session is {session.state}"
    if call is None:
        return "its call is gone"
    if call.status != ToolCallStatus.EXECUTING:
        return f"the call has finished ({call.status})"
    if call.dispatched_at is not None:
        return "the call was sent"
    if session.lease_owner == UNDO_HOLD:
        expires = session.lease_expires_at
        return None if expires is not None and expires > now else "the undo window has closed"
    if session.lease_owner:
        return "a worker has picked the run up"
    return None


def _ran_at(*, session: Session, approval: Approval, call: ToolCall | None) -> datetime | None:
    """When the decided step went on: the call sent, or else the decision's undo window
    closing (the run's continuation was due then)."""
    if call is not None and call.dispatched_at is not None:
        return call.dispatched_at
    if session.lease_owner == UNDO_HOLD and session.lease_expires_at is not None:
        return session.lease_expires_at
    if approval.decided_at is not None:
        return approval.decided_at + timedelta(seconds=settings.APPROVAL_UNDO_S)
    return call.finished_at if call is not None else None


def _changeable_check(approval: Approval) -> None:
    if approval.kind != ApprovalKind.TOOL_CALL or approval.status not in CHANGEABLE:
        what = (
            "a recovery review's answer"
            if approval.kind != ApprovalKind.TOOL_CALL
            else (f"a {approval.status} approval")
        )
        raise Conflict(
            f"{what} cannot be withdrawn or changed (only an approved or rejected call's "
            "decision, before the call starts)",
            details={"status": approval.status, "kind": approval.kind},
            code="approval_not_changeable",
        )


def _change_audit(
    *,
    approval: Approval,
    previous: str,
    before_arguments: dict[str, Any] | None,
    user: User,
    owner_id: int | None,
    key_prefix: str,
    reason: str,
) -> None:
    withdrawn = approval.status == "pending"
    before: dict[str, Any] = {"status": previous}
    after: dict[str, Any] = {"status": approval.status}
    if before_arguments is not None or approval.edited_arguments is not None:
        before["edited_arguments"] = before_arguments
        after["edited_arguments"] = approval.edited_arguments
    audit_record(
        action=AuditAction.APPROVAL_WITHDRAWN if withdrawn else AuditAction.APPROVAL_CHANGED,
        actor=f"{'api' if key_prefix else 'admin'}:{user.get_username()}",
        user_id=user.pk,
        key_prefix=key_prefix,
        object_type=Approval._meta.label_lower,
        object_id=approval.pk,
        object_repr=f"{approval.tool_name} ({approval.kind.replace('_', ' ')})",
        owner_id=owner_id,
        before=before,
        after=after,
        reason=reason,
        data={
            "tool": approval.tool_name,
            "session": str(approval.session_id),
            "deadline": approval.deadline.isoformat() if withdrawn else None,
        },
    )


def review_answer(
    *,
    approval_id: UUID | str,
    answer: str,
    user: User,
    groups: list[str],
    result: Any = None,
    comment: str = "",
    key_prefix: str = "",
) -> Approval:
    """A person's answer to "did this uncertain call take effect?"; the run goes on.

    `took_effect` (with the call's `result`, what the model reads), `not_taken`
    (the model is told it did not happen; nothing is sent) or `send_again`
    (sent once more with the same idempotency key).
    """
    approval = approval_get(approval_id=approval_id)
    if approval is None or approval.kind != ApprovalKind.RECOVERY_REVIEW:
        raise NotFound(f"recovery review {approval_id} not found")
    if approval.group not in groups:
        raise Forbidden(
            f"this review is for the group '{approval.group}'; you approve for {', '.join(groups)}",
            details={"group": approval.group},
        )
    _four_eyes_check(approval=approval, user=user)
    if answer not in ReviewAnswer.values:
        raise InvalidInput(
            f"answer must be one of {', '.join(ReviewAnswer.values)}", details={"field": "answer"}
        )
    if answer != ReviewAnswer.TOOK_EFFECT and result is not None:
        raise InvalidInput("a result goes only with took_effect", details={"field": "result"})
    if approval.status != "pending":
        raise _resolved_conflict(approval)
    resolved = _approval_apply(
        approval=approval,
        decision=Decision(
            # The call goes on (as it was, or sent again) or is closed as not having happened.
            Outcome.REJECTED if answer == ReviewAnswer.NOT_TAKEN else Outcome.APPROVED,
            user.get_username(),
            user=user,
            comment=comment,
            answer=answer,
            answer_result=result if answer == ReviewAnswer.TOOK_EFFECT else None,
        ),
        key_prefix=key_prefix,
    )
    if resolved is None:
        fresh = approval_get(approval_id=approval.pk)
        raise _resolved_conflict(fresh or approval)
    return resolved


def _approvers_approval(*, approval_id: UUID | str, user: User, groups: list[str]) -> Approval:
    """The approval, if this approver may decide it: 404 if there is none, 403 if it is for
    another group than theirs, 403 `four_eyes` if they own its session."""
    approval = approval_get(approval_id=approval_id)
    if approval is None:
        raise NotFound(f"approval {approval_id} not found")
    if approval.group not in groups:
        raise Forbidden(
            f"this approval is for the group '{approval.group}'; you approve for {', '.join(groups)}",
            details={"group": approval.group},
        )
    _four_eyes_check(approval=approval, user=user)
    return approval


def _four_eyes_check(*, approval: Approval, user: User) -> None:
    """403 `four_eyes` when the decider owns the approval's session (APPROVAL_FOUR_EYES)."""
    owner_id = (
        Session.objects.filter(pk=approval.session_id).values_list("owner_id", flat=True).first()
    )
    if four_eyes_forbids(session_owner_id=owner_id, decider_id=user.pk):
        raise Forbidden(
            "this approval belongs to a session you own; another approver must decide it "
            "(four-eyes rule)",
            details={"session": str(approval.session_id)},
            code="four_eyes",
        )


def _edited_arguments(approval: Approval, arguments: Any) -> dict[str, Any]:
    """What runs after an approval with edits (InvalidInput: 400). A workflow's review
    takes edits only of the state values its human node declares `editable`, sent as
    `{name: value}`; the rest of its card is what was decided on and stays as it was."""
    if not approval.tool_name.startswith(REVIEW_PREFIX):
        tool = tools_for_agent([approval.tool_name]).get(approval.tool_name)
        return approval_arguments_check(approval=approval, tool=tool, arguments=arguments)
    editable = (approval.arguments or {}).get("editable")
    if not isinstance(editable, dict) or not editable:
        raise InvalidInput(
            "this review has nothing to edit (its workflow node declares no `editable` "
            "values): approve or reject it as it is",
            code="not_editable",
            details={"field": "arguments"},
        )
    unknown = sorted(set(arguments) - editable.keys()) if isinstance(arguments, dict) else None
    if unknown is None or unknown:
        raise InvalidInput(
            f"edit only {', '.join(sorted(editable))}, as an object of name -> value"
            + (f" (not {', '.join(unknown)})" if unknown else ""),
            code="invalid_arguments",
            details={"field": "arguments", "editable": sorted(editable)},
        )
    return {**approval.arguments, "editable": {**editable, **arguments}}


def _resolved_conflict(approval: Approval) -> Conflict:
    if (
        approval.status == "pending"
        and approval.deadline is not None
        and approval.deadline <= timezone.now()
    ):
        # Past its deadline: the approval's timeout policy decides it, not a late approver.
        return Conflict(
            f"approval {approval.pk} passed its deadline; its timeout policy applies",
            details={"status": approval.status, "deadline": approval.deadline.isoformat()},
            code="approval_expired",
        )
    return Conflict(
        f"approval {approval.pk} is already {approval.status}",
        details={"status": approval.status, "decided_by": approval.decided_by_name},
        code="approval_resolved",
    )


def approvals_expire_due(*, limit: int = 100) -> list[str]:
    """Apply each overdue approval's default policy, with the system as the actor.

    `reject` (expired), `approve`, or `escalate` once to the tool's other
    group with a fresh deadline (a second deadline then expires it). A
    decision that lands first wins; this then changes nothing.
    """
    done: list[str] = []
    for approval in approvals_due(limit=limit):
        policy = approval.on_timeout
        if policy == "approve":
            outcome, comment = Outcome.APPROVED, "approved by the deadline policy"
        elif policy == "escalate" and approval.escalate_to and approval.escalations == 0:
            outcome, comment = Outcome.ESCALATED, f"escalated to {approval.escalate_to}"
        else:
            outcome, comment = Outcome.EXPIRED, "no decision before the deadline"
        resolved = _approval_apply(
            approval=approval,
            decision=Decision(
                outcome,
                SYSTEM_ACTOR,
                comment=comment,
                escalate_to=approval.escalate_to,
                deadline=timezone.now() + timedelta(seconds=approval.timeout_s)
                if outcome == Outcome.ESCALATED
                else None,
            ),
        )
        if resolved is not None:
            done.append(str(approval.pk))
    return done
