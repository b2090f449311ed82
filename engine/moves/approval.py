"""The moves approvals cause: pause for a person, record a decision, ask whether a call took
effect. The gate that decides which calls wait is engine/gates/approval.py.

- `approvals_wait`, in the tool step: the approvals the gate asked for are stored and the
  session moves to `awaiting_approval` in the same commit; the worker then gives its
  lease back (no worker waits on a person).
- `approval_recorded`, for a decision or a deadline: the `approval.resolved` event, and
  once nothing of the step is pending, back to `tool_wait`, where the gate lets approved
  calls run and turns refused ones into results.
- `approval_changed`, for a decision withdrawn or changed before its call started.
- `recovery_reviews_open`: an uncertain call no probe could settle, or a call whose
  business precheck failed after a recovery or a pause, goes to a person.
"""

from dataclasses import replace

from django.db import transaction
from django.utils import timezone

from approvals.models import Approval, ApprovalKind
from approvals.services import approval_request, approvals_insert
from approvals.states import UNDO_HOLD, Outcome
from engine.gates.approval import requested_event
from engine.moves.turn import build_step, metered_commit
from record.events import ApprovalResolved, EventSpec, EventType
from record.models import Session, ToolCall
from record.states import State, Trigger
from tools.execution import ToolSnapshot


def approvals_wait(session: Session, owner: str, requests: list[Approval]) -> None:
    """Store the approvals asked for and pause the session (-> awaiting_approval), in one commit."""
    with transaction.atomic():
        approvals_insert(approvals=requests)
        metered_commit(
            build_step(
                session,
                owner,
                trigger=Trigger.APPROVAL_NEEDED,
                phase="approval",
                reason=", ".join(a.tool_name for a in requests) or "approvals pending",
                events=[requested_event(a) for a in requests],
                checkpoint={"approvals": [str(a.pk) for a in requests]},
            )
        )


def approval_recorded(
    *,
    session: Session,
    approval: Approval,
    outcome: Outcome,
    by: str,
    resume: bool,
    undo_s: float = 0.0,
) -> None:
    """Record a decision (or a deadline's) on the session's stream; with `resume`, nothing
    of the step is pending any more and the calls go back to the tool phase (-> tool_wait).

    `undo_s`: the decision may be undone for that long; the session's lease is held in
    UNDO_HOLD's name until then (database clock), so no worker takes the run up sooner."""
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
    # Waiting for a person was not running: the resumed turn gets its full time.
    fields: dict[str, object] = {"turn_started_at": timezone.now()} if resume else {}
    step = build_step(
        session,
        None,
        trigger=trigger,
        phase="approval_decision",
        reason=f"{approval.tool_name}: {outcome.value} by {by}",
        actor=by,
        events=events,
        checkpoint={"approval": [str(approval.pk), outcome.value]},
        set_fields=fields,
    )
    if resume and undo_s > 0:
        fields["lease_owner"] = UNDO_HOLD
        step = replace(step, lease_seconds=undo_s)
    metered_commit(step)


def approval_changed(
    *, session: Session, approval: Approval, outcome: Outcome, previous: str, by: str
) -> None:
    """Record a decision withdrawn (pending again: the step waits for a person again,
    `tool_wait` -> `awaiting_approval`) or changed (approved <-> rejected) while its call
    had not started. The version moves either way, so a step begun on the old decision
    cannot commit on it."""
    resolved: ApprovalResolved = {
        "approval_id": str(approval.pk),
        "outcome": outcome.value,
        "by": by,
        "comment": approval.comment,
        "previous": previous,
    }
    events = [EventSpec(EventType.APPROVAL_RESOLVED, resolved)]
    trigger = None
    fields: dict[str, object] = {}
    if outcome == Outcome.WITHDRAWN:
        events.append(requested_event(approval))
        if State(session.state) == State.TOOL_WAIT:
            trigger = Trigger.APPROVAL_NEEDED
        if session.lease_owner == UNDO_HOLD:
            # Waiting for a person again: nothing to hold the run back from.
            fields["lease_owner"] = None
    metered_commit(
        build_step(
            session,
            None,
            trigger=trigger,
            phase="approval_change",
            reason=f"{approval.tool_name}: {previous} -> {approval.status} by {by}",
            actor=by,
            events=events,
            checkpoint={"approval": [str(approval.pk), outcome.value, previous]},
            set_fields=fields,
        )
    )


def recovery_reviews_open(
    session: Session,
    owner: str,
    uncertain: list[tuple[ToolCall, str]],
    tools: dict[str, ToolSnapshot],
    *,
    revalidated: bool = False,
) -> None:
    """Ask a person about each call, with why (-> awaiting_approval), in one commit: did
    an uncertain call take effect, or may a call whose precondition failed be sent?

    `revalidated`: the step ran a recovery's business prechecks; `resume_check` is spent
    (engine/moves/turn.py `tool_results`)."""
    now = timezone.now()
    reviews = [
        approval_request(
            call=call,
            tool=tools[call.tool_name],
            reason=reason,
            now=now,
            kind=ApprovalKind.RECOVERY_REVIEW,
        )
        for call, reason in uncertain
    ]
    with transaction.atomic():
        approvals_insert(approvals=reviews)
        metered_commit(
            build_step(
                session,
                owner,
                trigger=Trigger.APPROVAL_NEEDED,
                phase="recovery_review",
                reason="a person decides: " + ", ".join(c.tool_name for c, _ in uncertain),
                events=[requested_event(a) for a in reviews],
                set_fields={"resume_check": False} if revalidated else None,
                checkpoint={
                    "reviews": [
                        [str(a.pk), c.idempotency_key, reason]
                        for a, (c, reason) in zip(reviews, uncertain, strict=True)
                    ]
                },
            )
        )
