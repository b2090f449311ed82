from itertools import product

import pytest

from approvals.states import (
    CHANGEABLE,
    MOVES,
    RESOLVED,
    ApprovalStatus,
    IllegalApprovalMove,
    Outcome,
    approval_next,
)

A, Out = ApprovalStatus, Outcome


def test_a_pending_approval_is_decided_and_only_a_persons_decision_is_taken_back():
    for status, outcome in product(ApprovalStatus, Outcome):
        allowed = (
            (status == A.PENDING and outcome != Out.WITHDRAWN)
            or (status == A.APPROVED and outcome in (Out.WITHDRAWN, Out.REJECTED))
            or (status == A.REJECTED and outcome in (Out.WITHDRAWN, Out.APPROVED))
        )
        if allowed:
            assert approval_next(status, outcome) in ApprovalStatus
        else:
            with pytest.raises(IllegalApprovalMove):
                approval_next(status, outcome)


def test_escalation_stays_pending_and_everything_else_resolves():
    assert approval_next("pending", "escalated") == ApprovalStatus.PENDING
    from_pending = {to for (s, o), to in MOVES.items() if s == A.PENDING and o != Out.ESCALATED}
    assert from_pending == set(RESOLVED)


def test_a_withdrawn_decision_is_pending_again_and_a_changed_one_the_other_way():
    assert (
        approval_next("approved", "withdrawn")
        == approval_next("rejected", "withdrawn")
        == A.PENDING
    )
    assert approval_next("approved", "rejected") == A.REJECTED
    assert approval_next("rejected", "approved") == A.APPROVED
    assert {A.APPROVED, A.REJECTED} == CHANGEABLE
    for final in (A.EXPIRED, A.CANCELLED):  # the deadline's and a cancel's are final
        for outcome in Outcome:
            with pytest.raises(IllegalApprovalMove):
                approval_next(final, outcome)
