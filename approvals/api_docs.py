"""What the schema tells an approver app's developer about each approvals operation.

Stacked on the views' own `extend_schema` (which names the serializers); see
sessions/api/docs.py for the rules these texts follow.
"""

from drf_spectacular.utils import OpenApiExample, OpenApiParameter, extend_schema

from restapi.schema import error_example

APPROVAL_ID = "7d3e9c1a-4b2f-4e6d-8a0c-1f2e3d4c5b6a"

APPROVAL = {
    "id": APPROVAL_ID,
    "session": "0b6f2a4e-5d1c-4e8f-9a3b-7c2d1e0f4a5b",
    "kind": "tool_call",
    "tool": "issue_coupon",
    "arguments": {"customer_id": 2, "amount": 60, "reason": "parcel lost"},
    "edited_arguments": None,
    "risk_level": 3,
    "reason": "risk level 3",
    "status": "pending",
    "group": "",
    "requested_at": "2026-12-06T09:00:00.000000Z",
    "deadline": "2026-12-06T09:30:00.000000Z",
    "decided_by": "",
    "decided_at": None,
    "comment": "",
    "answer": "",
    "answer_result": None,
}

DECIDED = {
    **APPROVAL,
    "status": "approved",
    "edited_arguments": {"customer_id": 2, "amount": 20, "reason": "parcel lost"},
    "decided_by": "alice",
    "decided_at": "2026-12-06T09:02:00.000000Z",
    "comment": "20 is our maximum without a manager",
}

APPROVAL_PARAMETER = OpenApiParameter(
    "approval_id",
    str,
    OpenApiParameter.PATH,
    description="The approval's `id`, from `GET /api/v1/approvals/` or the session's "
    "`approval.requested` event.",
)

WHO = (
    "Only an approver's key may call this (403 `permission_denied` otherwise; an operator "
    "makes a user an approver), and only for approvals of the approver's groups (403 "
    "`forbidden` for another group's)."
)
NOT_FOUND = error_example(404, "not_found", f"approval {APPROVAL_ID} not found")
NOT_AN_APPROVER = error_example(
    403, "permission_denied", "this API key belongs to a user who is not an approver"
)
RESOLVED = error_example(
    409,
    "approval_resolved",
    f"approval {APPROVAL_ID} is already approved",
    {"status": "approved", "decided_by": "alice"},
)
NOT_CHANGEABLE = error_example(
    409,
    "call_started",
    f"the call of approval {APPROVAL_ID} has started (sent); its decision stands",
    {"reason": "sent", "state": "tool_wait", "call_status": "executing"},
)

approval_list = extend_schema(
    summary="List approvals",
    description=f"""
The tool calls that wait for (or got) a person's decision, oldest first: what the agent
wants to run (`tool`, `arguments`), why it needs a person (`reason`, `risk_level`) and by
when (`deadline`; after it the tool's timeout policy decides). A session waiting for an
approval sits in `awaiting_approval` until every one of its pending approvals is decided.

- `status`: only approvals in this state (`pending` for the queue).
- `limit` (1-1000, default 100).

{WHO} Live updates: the approvers' websocket `/ws/approvals/` (see the websocket page).

Errors: 400 `invalid_input` for an unknown `status` or a `limit` out of range, 403.
""",
    parameters=[
        OpenApiParameter("status", str, description="Only approvals in this state."),
        OpenApiParameter("limit", int, description="At most this many: 1 to 1000, default 100."),
    ],
    examples=[
        OpenApiExample("A pending approval", value=APPROVAL, response_only=True),
        NOT_AN_APPROVER,
    ],
)

approval_approve = extend_schema(
    parameters=[APPROVAL_PARAMETER],
    summary="Approve a tool call",
    description=f"""
Lets the call run; the agent's turn goes on. Give `arguments` to run the call with
edited arguments instead of the agent's (they must be valid for the tool: 400
`invalid_arguments`); the session's records keep both. `comment` is shown to the agent.

{WHO} An approval of a session you own may need another approver (403 `four_eyes`, when
the operator requires it). Changed your mind? `.../withdraw/` or `.../change/`, until the
call starts.

Errors: 400 `invalid_input` or `invalid_arguments`, 400 `review_needs_answer` (a recovery
review is answered with `.../review/`), 403, 404, 409 `approval_resolved` (already
decided: a repeated approve gets this) or `approval_expired` (past its deadline).
""",
    examples=[
        OpenApiExample("Approve", value={"comment": "ok"}, request_only=True),
        OpenApiExample(
            "Approve with a smaller amount",
            value={
                "arguments": {"customer_id": 2, "amount": 20, "reason": "parcel lost"},
                "comment": "20 is our maximum without a manager",
            },
            request_only=True,
        ),
        OpenApiExample("Approved", value=DECIDED, response_only=True),
        RESOLVED,
        NOT_FOUND,
    ],
)

approval_reject = extend_schema(
    parameters=[APPROVAL_PARAMETER],
    summary="Reject a tool call",
    description=f"""
The call never runs. The agent receives a tool result saying it was rejected, with your
`comment` (required), and carries on (usually telling the user).

{WHO}

Errors: 400 `invalid_input` (no `comment`), 403, 404, 409 `approval_resolved` or
`approval_expired`.
""",
    examples=[
        OpenApiExample(
            "Reject", value={"comment": "No coupons above 50 this month."}, request_only=True
        ),
        OpenApiExample(
            "Rejected",
            value={**DECIDED, "status": "rejected", "edited_arguments": None},
            response_only=True,
        ),
        RESOLVED,
        NOT_FOUND,
    ],
)

approval_review = extend_schema(
    parameters=[APPROVAL_PARAMETER],
    summary="Answer a recovery review",
    description=f"""
After an outage the platform cannot always tell whether a call with side effects took
effect (the request left, no answer came back). Such a call becomes an approval of kind
`recovery_review`, and a person answers:

- `took_effect`: it happened; give its `result` as the agent should read it (optional);
- `not_taken`: it did not happen, and the agent is told so;
- `send_again`: run it again.

{WHO}

Errors: 400 `invalid_input` (an unknown `answer`), 403, 404, 409 `approval_resolved`.
""",
    examples=[
        OpenApiExample(
            "It took effect",
            value={
                "answer": "took_effect",
                "result": {"coupon_code": "CPN-7F3A", "amount": 20},
                "comment": "checked in the coupon system",
            },
            request_only=True,
        ),
        OpenApiExample(
            "Answered",
            value={
                **DECIDED,
                "kind": "recovery_review",
                "answer": "took_effect",
                "answer_result": {"coupon_code": "CPN-7F3A", "amount": 20},
            },
            response_only=True,
        ),
        RESOLVED,
        NOT_FOUND,
    ],
)

CHANGE_ERRORS = """
Only while the call has not started: within the decision's undo window (until
`undo_until`, a few seconds after the decision). Errors: 403, 404, 409 `call_started` (the undo window closed, the call
was sent or finished, a worker picked the run up, or the session moved on; `details.ran_at`
says when the step ran), 409
`approval_not_changeable` (a pending, expired or cancelled approval, or a recovery
review). The session's events show the change (`approval.resolved` with `previous`).
"""

approval_withdraw = extend_schema(
    parameters=[APPROVAL_PARAMETER],
    summary="Withdraw a decision",
    description=f"""
Takes an approval or a rejection back: the call waits for a decision again, with a fresh
deadline (`approval.resolved` with outcome `withdrawn`, then a new `approval.requested`).

{WHO}
{CHANGE_ERRORS}""",
    examples=[
        OpenApiExample(
            "Withdraw", value={"comment": "wrong customer, checking again"}, request_only=True
        ),
        OpenApiExample("Pending again", value=APPROVAL, response_only=True),
        NOT_CHANGEABLE,
        NOT_FOUND,
    ],
)

approval_change = extend_schema(
    parameters=[APPROVAL_PARAMETER],
    summary="Change a decision",
    description=f"""
Turns an approval into a rejection (the call never runs; the agent reads your
`comment`, required) or a rejection into an approval (the call runs, with edited
`arguments` if given). Changing to the decision it already has: 400 `unchanged`.

{WHO}
{CHANGE_ERRORS}""",
    examples=[
        OpenApiExample(
            "Reject after all",
            value={"decision": "rejected", "comment": "the customer already got a refund"},
            request_only=True,
        ),
        OpenApiExample(
            "Rejected now",
            value={**DECIDED, "status": "rejected", "comment": "the customer already got a refund"},
            response_only=True,
        ),
        NOT_CHANGEABLE,
        NOT_FOUND,
    ],
)
