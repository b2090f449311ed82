"""Human approval of tool calls, the gate: which of a tool step's calls wait for a person.

The approvals themselves (rows, races, deadlines, notifications) are the
`approvals` port's, and the moves they cause are in engine/moves/approval.py.
Here, at the start of a tool step:

- `approval_gate`: calls that need a person get one approval each (asked for by
  the `approvals_wait` move, which pauses the session); approved calls run (with
  edited arguments, if any) and rejected or expired ones become a tool result
  that says so. The step's other calls wait with them, so results keep the
  model's order.
"""

from django.utils import timezone

from approvals.models import Approval
from approvals.policy import approval_reason
from approvals.selectors import approval_remembered, approvals_for_calls
from approvals.services import approval_request
from approvals.states import ApprovalStatus
from engine.gates import Verdict, Wait
from record.events import ApprovalRequested, EventSpec, EventType
from record.models import Refusal, Session, ToolCall, ToolCallStatus
from tools.execution import ToolOutcome, ToolSnapshot
from tools.rendering import render_failure


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
    refusal = ""
    if approval.status == ApprovalStatus.REJECTED:
        refusal = Refusal.REJECTED
        message = f"{approval.decided_by_name or 'an approver'} rejected this call; it did not run.{comment}"
    elif approval.status == ApprovalStatus.EXPIRED:
        refusal = Refusal.EXPIRED
        message = f"no one approved this call before its deadline; it did not run.{comment}"
    else:
        message = f"this call was {approval.status} and did not run.{comment}"
    return ToolOutcome(
        status=ToolCallStatus.REJECTED,
        output=None,
        error=message,
        content=render_failure(ToolCallStatus.REJECTED, message),
        extra={"approval": str(approval.pk), "refusal": refusal},
    )


def approval_gate(
    session: Session, calls: list[ToolCall], tools: dict[str, ToolSnapshot]
) -> Verdict[list[Approval]]:
    """Which of the step's calls a person refused (settled: they never run), and which wait
    for a person: the step waits for an approval asked earlier, or for those in its intent
    (one per call, not yet stored: the tool phase asks for them and pauses the session,
    moves.approval.approvals_wait). The calls' risk levels are assessed first, by the phase
    (engine/gates/risk.py)."""
    # Only calls a person was asked about have an approval to read (the tool
    # step's one query says which), so an ungated step pays no extra round trip.
    decided = approvals_for_calls(
        call_ids=[c.pk for c in calls if getattr(c, "has_approval", True)]
    )
    refused: dict[int, ToolOutcome] = {}
    pending = False
    fresh: list[Approval] = []
    now = timezone.now()
    for call in calls:
        approval = decided.get(call.pk)
        if approval is not None:
            if approval.status == ApprovalStatus.PENDING:
                pending = True
            elif approval.status == ApprovalStatus.APPROVED:
                if approval.edited_arguments is not None and call.proposed_input is None:
                    # What runs is what the approver approved; the results' commit records
                    # it as the call's input and keeps the model's beside it (both stay on
                    # the approval too).
                    call.proposed_input, call.input = call.input, approval.edited_arguments
            else:
                refused[call.pk] = refused_outcome(approval)
            continue
        tool = tools.get(call.tool_name)
        if tool is None or call.error or not isinstance(call.input, dict):
            continue  # the executor reports an unknown tool or bad arguments to the model
        reason = approval_reason(tool, call.input, call.risk_level, call.risk_reason)
        if reason is None or approval_remembered(
            session_id=session.pk, tool_name=tool.name, arguments=call.input
        ):
            continue
        fresh.append(approval_request(call=call, tool=tool, reason=reason, now=now))
    wait = Wait("approval") if fresh or pending else None
    return Verdict(settled=refused, wait=wait, intent=fresh)
