"""Risk levels in the tool phase (runtime-mechanisms 3.3): assess each call once (the
recovery checkpoint committed before a level 2 or 3 call runs is the move
engine/moves/checkpoint.py).

The level and why are stored on the call (the admin shows them); level 3 also
waits for a person (approvals/policy.py). The pre-run checkpoint holds what
recovery and compensation need: the call, its idempotency key, how to probe it,
and the environment fingerprint the call was made in.
"""

from typing import Any

from django.db import connection

from record.models import ToolCall
from tools.execution import ToolSnapshot
from tools.risk import FailureCount, assess_risk

CHECKPOINT_LEVEL = 2
# How far back a tool's failure rate looks: its latest finished calls, within this window.
RECENT_CALLS = 20
RECENT_WINDOW = "1 hour"


def failure_counts(names: list[str]) -> dict[str, FailureCount]:
    """Each tool's failed / finished among its latest calls (one indexed query)."""
    if not names:
        return {}
    table = ToolCall._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            # SQL names from model metadata (constants); every value is a bound parameter.
            f"""SELECT n.name,
                       count(*) FILTER (WHERE r.status IN ('failed', 'timeout')),
                       count(r.status)
                  FROM unnest(%s::text[]) AS n(name)
                  LEFT JOIN LATERAL (
                       SELECT status FROM "{table}" c
                        WHERE c.tool_name = n.name AND c.status <> 'executing'
                          AND c.created_at > now() - interval '{RECENT_WINDOW}'
                        ORDER BY c.id DESC LIMIT %s) r ON true
                 GROUP BY n.name""",  # nosec B608
            [sorted(set(names)), RECENT_CALLS],
        )
        return {name: FailureCount(failed, total) for name, failed, total in cursor.fetchall()}


def calls_assess(calls: list[ToolCall], tools: dict[str, ToolSnapshot]) -> None:
    """Give each not yet assessed call its level and why.

    They are stored by the commit that writes the calls' results (or, for a
    level 2+ call, first kept in its pre-run checkpoint), so assessing costs no
    write of its own. Only side-effecting tools read their recent failure rate:
    a read-only call's level (0, or 1 after the bump) changes nothing the
    engine does, so it is not worth a query on every tool step.
    """
    fresh = [c for c in calls if c.risk_level is None and c.tool_name in tools]
    if not fresh:
        return
    undeclared = [
        c.tool_name
        for c in fresh
        if tools[c.tool_name].risk_level is None and tools[c.tool_name].side_effects
    ]
    counts = failure_counts(undeclared)
    for call in fresh:
        risk = assess_risk(tools[call.tool_name], call.input, counts.get(call.tool_name))
        call.risk_level, call.risk_reason = risk.level, risk.why[:200]


def probe_of(tool: ToolSnapshot) -> dict[str, Any]:
    if tool.status_url:
        return {"kind": "http", "status_url": tool.status_url}
    if tool.probe_handler:
        return {"kind": "python", "handler": tool.probe_handler}
    return {"kind": "none"}
