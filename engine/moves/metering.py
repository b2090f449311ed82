"""Metering in the step's commit: the statements a move puts on its step (the store
knows no billing).

- The step that commits the results settles (success) or releases (anything
  else) the reservations in its own transaction, and adds the step's tokens,
  cost and calls to the daily rollups there too: no second commit.
- Reservations a crash or an ended turn left open are reconciled by the sweeper
  from the calls' final status (sessions/services/).
- A model call made outside a step (the memory extraction after a turn) is committed
  by the store's `side_call_commit` in a short transaction of its own, with the same
  rollup and charge statements as a step's (`side_call_charges`).
- A paid model call is charged for the tokens it used in the step's commit, keyed by
  session, step and position: a re-run never charges twice.
- The points a credit pool granted a step's paid calls (engine/gates/credit_pool.py) come
  back in the commit of their results, in the same batch.
"""

from decimal import Decimal
from typing import Any

from billing.pricing import model_call_points
from billing.services import (
    EndpointSpend,
    ModelCharge,
    Statement,
    ToolRun,
    UsageFigures,
    budget_release_statement,
    credits_close_statement,
    model_charge_statement,
    pool_release_statement,
    spend_statement,
    tool_usage_statement,
    usage_statement,
)
from record.models import ModelCall, Session, ToolCall, ToolCallStatus


def step_metering(
    session: Session,
    model_calls: list[Any],
    tool_calls: list[ToolCall],
    guard: str,
) -> list[Statement | None]:
    """The rollup upserts and credit settlements of one step, for its batch, and the release
    of the budget hold its model call took (`budget_gate.budget_hold`): the hold goes in
    the same transaction as the cost comes into the rollups."""
    finished = [c for c in tool_calls if c.status != ToolCallStatus.EXECUTING]
    ran = [c for c in finished if c.status != ToolCallStatus.REJECTED]
    held: list[Statement | None] = []
    if getattr(session, "budget_held", False):
        session.budget_held = False  # type: ignore[attr-defined]
        held.append(budget_release_statement(session_id=session.pk, guard=guard))
    if getattr(session, "pool_held", False):
        # The calls its credit pool granted have run: their points come back with the results.
        session.pool_held = False  # type: ignore[attr-defined]
        held.append(pool_release_statement(session_id=session.pk, guard=guard))
    if not model_calls and not finished:
        return held
    usage = UsageFigures(
        input_tokens=sum(m.input_tokens for m in model_calls),
        output_tokens=sum(m.output_tokens for m in model_calls),
        cost=sum((m.cost for m in model_calls), start=Decimal(0)),
        model_calls=len(model_calls),
        tool_calls=len(ran),
    )
    writes: list[Statement | None] = [
        rollup_and_charges(session, model_calls, usage, guard),
        model_spend(session, model_calls, guard),
    ]
    if ran:
        writes.append(
            tool_usage_statement(
                owner_id=session.owner_id,
                session_id=session.pk,
                runs=[
                    ToolRun(c.tool_name, c.status != ToolCallStatus.SUCCESS, c.elapsed_ms or 0)
                    for c in ran
                ],
                guard=guard,
            )
        )
    metered = [c for c in finished if getattr(c, "credit_points", 0)]
    settled = [c.idempotency_key for c in metered if c.status == ToolCallStatus.SUCCESS]
    released = [c.idempotency_key for c in metered if c.status != ToolCallStatus.SUCCESS]
    writes.append(credits_close_statement(keys=settled, settle=True, guard=guard))
    writes.append(credits_close_statement(keys=released, settle=False, guard=guard))
    return writes + held


def rollup_and_charges(
    session: Session,
    model_calls: list[Any],
    usage: UsageFigures,
    guard: str,
    key_prefix: str = "model",
) -> Statement | None:
    """The step's rollup upsert, or, when a model call costs points, its charge statement
    carrying the rollup figures too: one write of the rollup row either way."""
    charged = model_charges(session, model_calls, guard, key_prefix, usage=usage)
    if charged is not None:
        return charged
    return usage_statement(
        owner_id=session.owner_id,
        agent_id=session.agent_id,
        session_id=session.pk,
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        cost=usage.cost,
        model_calls=usage.model_calls,
        tool_calls=usage.tool_calls,
        guard=guard,
    )


def model_spend(session: Session, model_calls: list[Any], guard: str) -> Statement | None:
    """The step's model calls in the spend rollup per endpoint and API key (the cost pages'
    series by model, the breakdowns per endpoint and key, the key budgets)."""
    return spend_statement(
        owner_id=session.owner_id,
        agent_id=session.agent_id,
        session_id=session.pk,
        api_key_id=session.api_key_id,
        calls=[
            EndpointSpend(call.endpoint_name, call.input_tokens, call.output_tokens, call.cost)
            for call in model_calls
        ],
        guard=guard,
    )


def model_charges(
    session: Session,
    model_calls: list[Any],
    guard: str,
    key_prefix: str = "model",
    *,
    usage: UsageFigures | None = None,
) -> Statement | None:
    """The points of the step's model calls on paid endpoints, for the step's batch."""
    charges = []
    for position, call in enumerate(model_calls):
        endpoint = call.endpoint
        tokens = call.input_tokens + call.output_tokens
        rate = endpoint.credits_per_1k_tokens if endpoint is not None else Decimal(0)
        points = model_call_points(tokens=tokens, credits_per_1k_tokens=rate)
        if points:
            charges.append(
                ModelCharge(
                    f"{key_prefix}:{session.pk}:{call.step}:{position}",
                    points,
                    f"{call.endpoint_name}: {tokens} tokens",
                )
            )
    if not charges:
        return None
    return model_charge_statement(
        owner_id=session.owner_id,
        agent_id=session.agent_id,
        session_id=session.pk,
        charges=charges,
        guard=guard,
        usage=usage,
    )


def side_call_charges(session: Session, record: ModelCall) -> list[Statement | None]:
    """The rollup upsert and the charge statement of a model call made outside a step (for
    the store's `side_call_commit`), keyed by purpose, session and turn (never a step's)."""
    usage = UsageFigures(
        input_tokens=record.input_tokens,
        output_tokens=record.output_tokens,
        cost=record.cost,
        model_calls=1,
    )
    return [
        rollup_and_charges(
            session, [record], usage, guard="", key_prefix=f"{record.purpose}:turn{record.turn}"
        ),
        model_spend(session, [record], guard=""),
    ]
