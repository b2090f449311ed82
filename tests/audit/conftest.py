"""The audit tests reuse the approvals' refund agent (a gated side-effecting tool)."""

from tests.approvals.conftest import (  # noqa: F401
    _clear_effects,
    approver,
    make_session,
    refund_agent,
    refund_tool,
    rules_model,
)
