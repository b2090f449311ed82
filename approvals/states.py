"""An approval's states and the moves between them: pure Python, one table.

A decision or the deadline sweep changes an approval only by a conditional
UPDATE from `pending` (sessions/services and approvals/services), so two
deciders racing on one approval get exactly one outcome; this table says which
outcome may follow which state. An approver's decision may be withdrawn (back to
`pending`) or changed (approved <-> rejected) while its call has not started, by
the same kind of conditional UPDATE from the decided state.
"""

from enum import StrEnum


class ApprovalStatus(StrEnum):
    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"
    EXPIRED = "expired"
    CANCELLED = "cancelled"


class Outcome(StrEnum):
    """What a decision (or the deadline) did: `approval.resolved` `outcome`."""

    APPROVED = "approved"
    REJECTED = "rejected"
    EXPIRED = "expired"
    ESCALATED = "escalated"
    CANCELLED = "cancelled"
    WITHDRAWN = "withdrawn"  # a decision taken back: pending again


A, Out = ApprovalStatus, Outcome

# (from, outcome) -> to. An escalation stays pending (another group, a new deadline).
MOVES: dict[tuple[ApprovalStatus, Outcome], ApprovalStatus] = {
    (A.PENDING, Out.APPROVED): A.APPROVED,
    (A.PENDING, Out.REJECTED): A.REJECTED,
    (A.PENDING, Out.EXPIRED): A.EXPIRED,
    (A.PENDING, Out.ESCALATED): A.PENDING,
    (A.PENDING, Out.CANCELLED): A.CANCELLED,
    # A decision whose call has not started: withdrawn, or changed the other way.
    (A.APPROVED, Out.WITHDRAWN): A.PENDING,
    (A.REJECTED, Out.WITHDRAWN): A.PENDING,
    (A.APPROVED, Out.REJECTED): A.REJECTED,
    (A.REJECTED, Out.APPROVED): A.APPROVED,
}
# The decisions a person may still withdraw or change (their call not started yet).
CHANGEABLE: frozenset[ApprovalStatus] = frozenset({A.APPROVED, A.REJECTED})

# The lease owner a person's decision leaves on its session while it may still be undone
# (APPROVAL_UNDO_S): no worker takes the run up before the lease runs out, and a lease that
# lapses in this name is a window that closed, not a worker that died (no recovery check).
UNDO_HOLD = "undo-window"

RESOLVED: frozenset[ApprovalStatus] = frozenset({A.APPROVED, A.REJECTED, A.EXPIRED, A.CANCELLED})


class IllegalApprovalMove(Exception):
    def __init__(self, current: str, outcome: str) -> None:
        self.current, self.outcome = current, outcome
        super().__init__(f"an approval that is {current} cannot be {outcome}")


def approval_next(current: ApprovalStatus | str, outcome: Outcome | str) -> ApprovalStatus:
    try:
        return MOVES[(ApprovalStatus(current), Outcome(outcome))]
    except (KeyError, ValueError):
        raise IllegalApprovalMove(str(current), str(outcome)) from None
