"""The credit pool's gate: a tool step's paid calls ask their pool for points before they run.

A step's paid calls (a tool with `credit_cost` or a `cost` expression) make one request: its
action (their tools), estimated value (each tool's `value` CEL over the call's `args` and the
`session`, else the session's value) and estimated cost (each tool's `cost` CEL, else its
`credit_cost`), summed. `billing_pool_grant` grants it, or queues it by value / cost; a
queued request parks the session (`waiting_credits`, engine/moves/credits.py) and holds no
worker. An estimate that cannot be used (the expression failed, or gave a negative, NaN,
non-numeric or huge number) falls back to the default and says why on the request (the
admin's queue shows it) and in the log: the failure is visible, the call still runs.
"""

import logging
import math
from dataclasses import dataclass
from typing import Any

from billing.services import PoolGrant, pool_grant_of, pool_grant_statement
from engine.gates import Verdict, Wait
from engine.model.credits import INSUFFICIENT
from record.models import Refusal, Session, ToolCall, ToolCallStatus
from record.rows import execute_batch
from tools.execution import ToolOutcome, ToolSnapshot
from tools.rendering import render_failure
from workflows.expressions import EvaluationError, ExpressionError, expression_compile

logger = logging.getLogger(__name__)

# Past this an estimate is a mistake, not a figure (and a cost must fit a bigint).
ESTIMATE_MAX = 1e12


@dataclass(frozen=True)
class PoolAsk:
    """One step's request: what it is for, and its estimates."""

    key: str
    action: str
    value: float
    cost: int
    note: str = ""


@dataclass(frozen=True)
class PoolAnswer:
    """A pool verdict's intent: the step's ask and the pool's grant: `waiting` (the session
    parks: moves.credits.credits_park), or `granted` (the results' commit gives the points
    back). A request that can never fit is refused: its paid calls are settled."""

    ask: PoolAsk | None = None
    grant: PoolGrant | None = None

    @property
    def waiting(self) -> bool:
        return self.grant is not None and self.grant.outcome == "wait"

    @property
    def granted(self) -> bool:
        return self.grant is not None and self.grant.outcome == "granted"

    @property
    def pool_id(self) -> int | None:
        return self.grant.pool_id if self.grant is not None else None


def _scope(session: Session, call: ToolCall) -> dict[str, Any]:
    return {
        "args": call.input if isinstance(call.input, dict) else {},
        "session": {
            "value": session.value,
            "turn": session.turn,
            "iteration": session.iteration,
            "role": session.role,
            "degradation": session.degradation_level,
        },
    }


def estimate(source: str, scope: dict[str, Any], *, positive: bool) -> float:
    """A tool's estimate: a finite number, >= 0 (> 0 for a cost), at most ESTIMATE_MAX;
    anything else raises EvaluationError naming what was wrong."""
    try:
        result = expression_compile(source).evaluate(scope)
    except ExpressionError as exc:
        raise EvaluationError(exc.message) from exc
    if isinstance(result, bool) or not isinstance(result, int | float):
        raise EvaluationError(f"{source!r} gave {type(result).__name__}, not a number")
    number = float(result)
    if not math.isfinite(number) or number < 0 or (positive and number == 0):
        raise EvaluationError(
            f"{source!r} gave {result}, not a {'positive' if positive else 'non-negative'} number"
        )
    if number > ESTIMATE_MAX:
        raise EvaluationError(f"{source!r} gave {result}, more than {ESTIMATE_MAX:.0e}")
    return number


def pool_ask(
    session: Session, calls: list[ToolCall], tools: dict[str, ToolSnapshot]
) -> PoolAsk | None:
    """The step's request for its paid calls, or None when none is paid."""
    paid = [
        (call, tool)
        for call in calls
        if (tool := tools.get(call.tool_name)) is not None
        and tool.paid
        and not call.error
        and isinstance(call.input, dict)
    ]
    if not paid:
        return None
    value, cost, notes = 0.0, 0, []
    for call, tool in paid:
        scope = _scope(session, call)
        call_value = float(session.value)
        if tool.value:
            try:
                call_value = estimate(tool.value, scope, positive=False)
            except EvaluationError as exc:
                notes.append(
                    f"{tool.name}.value: {exc}; the session's value {session.value:g} is used"
                )
        call_cost = max(tool.credit_cost, 1)
        if tool.cost:
            try:
                call_cost = math.ceil(estimate(tool.cost, scope, positive=True))
            except EvaluationError as exc:
                notes.append(f"{tool.name}.cost: {exc}; {call_cost} (its credit_cost) is used")
        value += max(call_value, 0.0)
        cost += call_cost
    note = " | ".join(notes)
    if note:
        logger.warning("credit pool estimate failed: session=%s %s", session.pk, note[:500])
    return PoolAsk(
        key=f"pool:{paid[0][0].idempotency_key}",
        action=",".join(sorted({tool.name for _, tool in paid})),
        value=value,
        cost=cost,
        note=note,
    )


def pool_gate(
    session: Session, calls: list[ToolCall], tools: dict[str, ToolSnapshot]
) -> Verdict[PoolAnswer]:
    """Ask the pool for the step's paid calls: one statement, one round trip."""
    ask = pool_ask(session, calls, tools)
    if ask is None:
        return Verdict(intent=PoolAnswer())
    rows = execute_batch(
        [
            pool_grant_statement(
                owner_id=session.owner_id,
                key=ask.key,
                session_id=session.pk,
                action=ask.action,
                value=ask.value,
                cost=ask.cost,
                note=ask.note,
            )
        ]
    )
    grant = pool_grant_of(rows[0][0])  # type: ignore[index]
    answer = PoolAnswer(ask=ask, grant=grant)
    refused: dict[int, ToolOutcome] = {}
    if grant.outcome in ("too_big", "refused"):
        refused = {
            call.pk: _too_big(ask, grant)
            for call in calls
            if (tool := tools.get(call.tool_name)) is not None and tool.paid
        }
    wait = Wait("pool") if answer.waiting else None
    return Verdict(settled=refused, wait=wait, intent=answer)


def _too_big(ask: PoolAsk, grant: PoolGrant) -> ToolOutcome:
    if grant.outcome == "too_big":
        why = f"its estimated cost, {ask.cost} points, is more than the credit pool holds ({grant.size})"
    else:
        why = f"the credit pool can no longer hold its estimated cost, {ask.cost} points"
    message = f"{INSUFFICIENT}: {why}. It did not run. Choose a cheaper way, or answer with what you have."
    return ToolOutcome(
        status=ToolCallStatus.REJECTED,
        output={"code": INSUFFICIENT, "points_needed": ask.cost, "points_left": grant.size},
        error=message,
        content=render_failure(ToolCallStatus.REJECTED, message),
        extra={"refusal": Refusal.UNPAID},
    )
