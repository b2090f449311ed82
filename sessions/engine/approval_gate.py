"""Human approval of tool calls, on the session's side: pause before a gated call, resume after.

The approvals themselves (rows, races, deadlines, notifications) are the
`approvals` port's; here are the two moves they cause:

- `approval_gate`, at the start of a tool step: calls that need a person get
  one approval each, and the session moves to `awaiting_approval` in the same
  commit; the worker then gives its lease back (no worker waits on a person).
  The step's other calls wait with them, so results keep the model's order.
- `approval_recorded`, for a decision or a deadline: the `approval.resolved`
  event, and once nothing of the step is pending, back to `tool_wait`, where
  this gate lets approved calls run (with edited arguments, if any) and turns
  rejected or expired ones into a tool result that says so.
"""

from dataclasses import dataclass, field

from django.db import transaction
from django.utils import timezone

from approvals.models import Approval, ApprovalKind, ReviewAnswer
from approvals.policy import approval_reason
from approvals.selectors import approval_remembered, approvals_for_calls, reviews_for_calls
from approvals.services import approval_request, approvals_insert
from approvals.states import ApprovalStatus, Outcome
from tools.execution import ToolOutcome, ToolSnapshot
from tools.rendering import render_failure, render_success

from ..events import ApprovalRequested, ApprovalResolved, EventSpec, EventType
from ..models import Session, ToolCall, ToolCallStatus
from ..states import Trigger
from .commit import step_commit
from .moves import build_step
from .risk import calls_assess


@dataclass
class Gate:
    paused: bool
    # Calls a person refused (or the deadline expired): they never run.
    outcomes: dict[int, ToolOutcome] = field(default_factory=dict)


def requested_event(approval: Approval) -> EventSpec:
    data: ApprovalRequested = {
        "approval_id": str(approval.pk),
        "tool": approval.tool_name,
        "arguments": approval.arguments,
        "risk_level": approval.risk_level if approval.risk_level is not None else 0,
        "deadline": approval.deadline.isoformat().replace("+00:00", "Z"),
    }
    return EventSpec(EventType.APPROVAL_REQUESTED, data)


def refused_outcome(approval: Approval) -> ToolOutcome:
    """What the model reads for a call that did not run, with the approver's comment."""
    comment = f' Comment: "{approval.comment}"' if approval.comment else ""
    if approval.status == ApprovalStatus.REJECTED:
        message = f"{approval.decided_by_name or 'an approver'} rejected this call; it did not run.{comment}"
    elif approval.status == ApprovalStatus.EXPIRED:
        message = f"no one approved this call before its deadline; it did not run.{comment}"
    else:
        message = f"this call was {approval.status} and did not run.{comment}"
    return ToolOutcome(
        status=ToolCallStatus.REJECTED,
        output=None,
        error=message,
        content=render_failure(ToolCallStatus.REJECTED, message),
        extra={"approval": str(approval.pk)},
    )


def approval_gate(
    session: Session, owner: str, calls: list[ToolCall], tools: dict[str, ToolSnapshot]
) -> Gate:
    """Decide which of the step's calls wait for a person; pause the session if any do."""
    calls_assess(calls, tools)
    # Only calls a person was asked about have an approval to read (the tool
    # step's one query says which), so an ungated step pays no extra round trip.
    decided = approvals_for_calls(
        call_ids=[c.pk for c in calls if getattr(c, "has_approval", True)]
    )
    gate = Gate(paused=False)
    pending = False
    fresh: list[Approval] = []
    now = timezone.now()
    for call in calls:
        approval = decided.get(call.pk)
        if approval is not None:
            if approval.status == ApprovalStatus.PENDING:
                pending = True
            elif approval.status == ApprovalStatus.APPROVED:
                if approval.edited_arguments is not None:
                    # What runs is what the approver approved; both stay on the approval.
                    call.input = approval.edited_arguments
            else:
                gate.outcomes[call.pk] = refused_outcome(approval)
            continue
        tool = tools.get(call.tool_name)
        if tool is None or call.error or not isinstance(call.input, dict):
            continue  # the executor reports an unknown tool or bad arguments to the model
        reason = approval_reason(tool, call.input, call.risk_level, call.risk_reason)
        if reason is None or approval_remembered(
            session_id=session.pk, tool_name=tool.name, arguments=call.input
        ):
            continue
        fresh.append(
            approval_request(
                session_id=session.pk,
                turn=session.turn,
                step=call.step,
                tool_call_id=call.pk,
                call_position=call.position,
                tool=tool,
                arguments=call.input,
                reason=reason,
                now=now,
                risk_level=call.risk_level,
            )
        )
    if not fresh and not pending:
        return gate
    with transaction.atomic():
        approvals_insert(approvals=fresh)
        step_commit(
            build_step(
                session,
                owner,
                trigger=Trigger.APPROVAL_NEEDED,
                phase="approval",
                reason=", ".join(a.tool_name for a in fresh) or "approvals pending",
                events=[requested_event(a) for a in fresh],
                checkpoint={"approvals": [str(a.pk) for a in fresh]},
            )
        )
    gate.paused = True
    return gate


def approval_recorded(
    *, session: Session, approval: Approval, outcome: Outcome, by: str, resume: bool
) -> None:
    """Record a decision (or a deadline's) on the session's stream; with `resume`, nothing
    of the step is pending any more and the calls go back to the tool phase (-> tool_wait)."""
    resolved: ApprovalResolved = {
        "approval_id": str(approval.pk),
        "outcome": outcome.value,
        "by": by,
        "comment": approval.comment if outcome != Outcome.ESCALATED else "",
    }
    events = [EventSpec(EventType.APPROVAL_RESOLVED, resolved)]
    if outcome == Outcome.ESCALATED:
        events.append(requested_event(approval))
    trigger = None
    if resume:
        trigger = Trigger.APPROVED if outcome == Outcome.APPROVED else Trigger.REJECTED
    step_commit(
        build_step(
            session,
            None,
            trigger=trigger,
            phase="approval_decision",
            reason=f"{approval.tool_name}: {outcome.value} by {by}",
            actor=by,
            events=events,
            checkpoint={"approval": [str(approval.pk), outcome.value]},
            # Waiting for a person was not running: the resumed turn gets its full time.
            set_fields={"turn_started_at": timezone.now()} if resume else None,
        )
    )


# --- Recovery reviews: an uncertain call no probe could settle goes to a person ---


@dataclass
class Reviewed:
    # Calls a person settled (took effect / did not / nobody could tell): they are not sent.
    outcomes: dict[int, ToolOutcome] = field(default_factory=dict)
    # Calls a person said to send again with the same key, without another probe.
    resend: set[int] = field(default_factory=set)
    pending: bool = False


def review_outcomes(calls: list[ToolCall]) -> Reviewed:
    """What the people asked about this step's uncertain calls answered."""
    reviewed = Reviewed()
    uncertain = [c for c in calls if c.dispatched_at is not None]
    for call_id, review in reviews_for_calls(call_ids=[c.pk for c in uncertain]).items():
        call = next(c for c in uncertain if c.pk == call_id)
        if review.status == ApprovalStatus.PENDING:
            reviewed.pending = True
        elif review.answer == ReviewAnswer.SEND_AGAIN:
            # Sent again after the answer and uncertain once more: probe (and ask) anew.
            if review.decided_at is not None and call.dispatched_at <= review.decided_at:  # type: ignore[operator]
                reviewed.resend.add(call_id)
        elif review.answer == ReviewAnswer.TOOK_EFFECT:
            output = review.answer_result if review.answer_result is not None else {}
            reviewed.outcomes[call_id] = ToolOutcome(
                status=ToolCallStatus.SUCCESS,
                output=output,
                content=render_success(output),
                extra={"reviewed": str(review.pk)},
            )
        else:
            by = review.decided_by_name or "an operator"
            if review.answer == ReviewAnswer.NOT_TAKEN:
                message = f"{by} checked: this call did not take effect, and it was not sent again."
            else:
                message = (
                    "no one could tell whether this call took effect before a crash "
                    f"(review {review.status}); it was not sent again."
                )
            if review.comment:
                message += f' Comment: "{review.comment}"'
            reviewed.outcomes[call_id] = ToolOutcome(
                status=ToolCallStatus.FAILED,
                output=None,
                error=message,
                content=render_failure(ToolCallStatus.FAILED, message),
                extra={"reviewed": str(review.pk)},
            )
    return reviewed


def recovery_reviews_open(
    session: Session,
    owner: str,
    uncertain: list[tuple[ToolCall, str]],
    tools: dict[str, ToolSnapshot],
) -> None:
    """Ask a person whether each call took effect (-> awaiting_approval), in one commit."""
    now = timezone.now()
    reviews = [
        approval_request(
            session_id=session.pk,
            turn=session.turn,
            step=call.step,
            tool_call_id=call.pk,
            call_position=call.position,
            tool=tools[call.tool_name],
            arguments=call.input,
            reason=(
                f"Did this call take effect? {call.tool_name} was sent with idempotency key "
                f"{call.idempotency_key} before a crash; it cannot safely be sent again and "
                f"the probe said: {said}."
            ),
            now=now,
            risk_level=call.risk_level,
            kind=ApprovalKind.RECOVERY_REVIEW,
        )
        for call, said in uncertain
    ]
    with transaction.atomic():
        approvals_insert(approvals=reviews)
        step_commit(
            build_step(
                session,
                owner,
                trigger=Trigger.APPROVAL_NEEDED,
                phase="recovery_review",
                reason="did it take effect? " + ", ".join(c.tool_name for c, _ in uncertain),
                events=[requested_event(a) for a in reviews],
                checkpoint={
                    "reviews": [
                        [str(a.pk), c.idempotency_key, said]
                        for a, (c, said) in zip(reviews, uncertain, strict=True)
                    ]
                },
            )
        )
