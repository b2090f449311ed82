"""The recovery checkpoint committed before a level 2 or 3 call runs (runtime-mechanisms
3.3): what recovering or compensating the call needs, kept before it is sent. The call's
level is the risk gate's (engine/gates/risk.py).
"""

from django.db import transaction

from engine.gates.risk import CHECKPOINT_LEVEL, probe_of
from engine.moves.turn import build_step, step_commit
from sessions.models import Session, ToolCall, ToolCallStatus
from tools.execution import ToolSnapshot


def pre_run_checkpoint(
    session: Session, owner: str, calls: list[ToolCall], tools: dict[str, ToolSnapshot]
) -> None:
    """Before level 2+ calls are sent, commit what recovering or compensating them needs."""
    risky = [
        c
        for c in calls
        if (c.risk_level or 0) >= CHECKPOINT_LEVEL
        and c.tool_name in tools
        and c.status == ToolCallStatus.EXECUTING
    ]
    if not risky:
        return
    with transaction.atomic():
        step_commit(
            build_step(
                session,
                owner,
                trigger=None,
                phase="pre_run",
                reason="checkpoint before " + ", ".join(c.tool_name for c in risky),
                checkpoint={
                    "pre_run": [
                        {
                            "call_id": c.call_id,
                            "tool": c.tool_name,
                            "risk_level": c.risk_level,
                            "why": c.risk_reason,
                            "arguments": c.input,
                            "idempotency_key": c.idempotency_key,
                            "idempotent": tools[c.tool_name].idempotent,
                            "probe": probe_of(tools[c.tool_name]),
                            "env_fingerprint": session.env_fingerprint,
                        }
                        for c in risky
                    ]
                },
            )
        )
