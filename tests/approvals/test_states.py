from itertools import product

import pytest

from approvals.states import (
    MOVES,
    RESOLVED,
    ApprovalStatus,
    IllegalApprovalMove,
    Outcome,
    approval_next,
)


def test_only_a_pending_approval_moves():
    for status, outcome in product(ApprovalStatus, Outcome):
        if status == ApprovalStatus.PENDING:
            assert approval_next(status, outcome) in ApprovalStatus
        else:
            with pytest.raises(IllegalApprovalMove):
                approval_next(status, outcome)


def test_escalation_stays_pending_and_everything_else_resolves():
    assert approval_next("pending", "escalated") == ApprovalStatus.PENDING
    assert {to for (_, o), to in MOVES.items() if o != Outcome.ESCALATED} == set(RESOLVED)
