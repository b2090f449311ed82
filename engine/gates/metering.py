"""Metering in the step loop: credit points around tool calls, usage rollups in the step commit.

- Before a tool that costs points runs, its points are reserved (billing),
  keyed by the call's idempotency key: a re-run after a crash finds its
  reservation and is not charged again. A call the account cannot pay for does
  not run; the model gets a result with `insufficient_credits`, the points
  needed and left. A call whose points are held by in-flight calls waits
  (`CreditsWait`: the run gives its lease back for a moment and holds no worker).
- The step that commits the results settles (success) or releases (anything
  else) the reservations in its own transaction, and adds the step's tokens,
  cost and calls to the daily rollups there too: no second commit.
- Reservations a crash or an ended turn left open are reconciled by the sweeper
  from the calls' final status (sessions/services/).
- A model call made outside a step (the memory extraction after a turn) is committed
  by the store's `side_call_commit` in a short transaction of its own, with the same
  rollup and charge statements as a step's (`side_call_charges`).
- A model call on an endpoint with `credits_per_1k_tokens` is checked before it
  runs (its estimated tokens must fit the free balance and today's cap, else the
  turn ends with `insufficient_credits`) and charged for the tokens it used in the
  step's commit, keyed by session, step and position: a re-run never charges twice.
- The points a credit pool granted a step's paid calls (engine/gates/credit_pool.py) come
  back in the commit of their results, in the same batch.
"""

from decimal import Decimal
from typing import Any

from billing.pricing import model_call_points
from billing.selectors import CreditsCheck
from billing.services import (
    EndpointSpend,
    ModelCharge,
    Reservation,
    Statement,
    ToolRun,
    UsageFigures,
    budget_release_statement,
    credit_reserve_statement,
    credits_close_statement,
    model_charge_statement,
    pool_release_statement,
    reservation_of,
    spend_statement,
    tool_usage_statement,
    usage_statement,
)
from engine.gates import Stop, Verdict, partial_answer
from engine.model.credits import INSUFFICIENT
from record.events import EventSpec, EventType, Progress, StopReason
from record.models import ModelCall, Refusal, Session, ToolCall, ToolCallStatus
from record.rows import execute_batch
from record.states import Trigger
from tools.execution import ToolOutcome, ToolSnapshot
from tools.rendering import render_failure


class CreditsWait(Exception):
    """A call waits for points held by in-flight calls: try the step again shortly."""


def credits_reserve(
    session: Session, calls: list[ToolCall], tools: dict[str, ToolSnapshot]
) -> Verdict[None]:
    """Reserve the points of the calls about to run (each call marks itself
    `credit_points` for the commit that settles it); raise CreditsWait if one
    has to wait. Settled: the calls the account cannot pay for (they stay refused on the
    next try); events: a low-water mark crossed."""
    refused: dict[int, ToolOutcome] = {}
    events: list[EventSpec] = []
    waiting = False
    paid: list[tuple[ToolCall, int]] = []
    for call in calls:
        tool = tools.get(call.tool_name)
        points = tool.credit_cost if tool is not None else 0
        if points > 0 and not call.error and isinstance(call.input, dict):
            paid.append((call, points))
    # One round trip for all of them: the batch is one transaction.
    rows = execute_batch(
        [
            credit_reserve_statement(
                owner_id=session.owner_id,
                idempotency_key=call.idempotency_key,
                points=points,
                session_id=session.pk,
                agent_id=session.agent_id,
                tool=call.tool_name,
                value=session.value,
            )
            for call, points in paid
        ],
        prepare=True,
    )
    for (call, points), answer in zip(paid, rows, strict=True):
        reservation = reservation_of(answer[0], points)  # type: ignore[index]
        if reservation.outcome == "reserved":
            call.credit_points = points  # type: ignore[attr-defined]
            if reservation.low_water_crossed:
                events.append(_low_water_event(session, reservation))
        elif reservation.outcome == "insufficient":
            refused[call.pk] = insufficient_outcome(reservation)
        elif reservation.outcome == "wait":
            waiting = True
    if waiting:
        raise CreditsWait(f"session {session.pk} waits for points held by in-flight calls")
    return Verdict(settled=refused, events=tuple(events))


def insufficient_outcome(reservation: Reservation) -> ToolOutcome:
    needed, left = reservation.points, reservation.points_left
    why = (
        "today's credit cap is reached"
        if reservation.reason == "daily_cap"
        else "not enough credit points"
    )
    if reservation.reason == "no_account":
        why = "the user has no credit account"
    message = (
        f"{INSUFFICIENT}: {why}; this call needs {needed} points and {left} are left. "
        "It did not run. Choose a cheaper way, or answer with what you have."
    )
    return ToolOutcome(
        status=ToolCallStatus.REJECTED,
        output={"code": INSUFFICIENT, "points_needed": needed, "points_left": left},
        error=message,
        content=render_failure(ToolCallStatus.REJECTED, message),
        extra={"refusal": Refusal.UNPAID},
    )


def insufficient_before(session: Session, step: int) -> bool:
    """Did an earlier step of this turn already get `insufficient_credits`?"""
    return ToolCall.objects.filter(
        session=session,
        turn=session.turn,
        step__lt=step,
        status=ToolCallStatus.REJECTED,
        error__startswith=INSUFFICIENT,
    ).exists()


def _low_water_event(session: Session, reservation: Reservation) -> EventSpec:
    data: Progress = {
        "stage": "credits_low",
        "kind": "credits.low",
        "turn": session.turn,
        "balance": reservation.balance,
        "low_water_mark": reservation.low_water_mark,
    }
    return EventSpec(EventType.PROGRESS, data)


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


def credits_note(check: CreditsCheck) -> str:
    why = (
        "today's credit cap is reached" if check.reason == "daily_cap" else "credit points ran out"
    )
    if check.reason == "no_account":
        why = "there is no credit account for this user"
    return f"I had to stop here: {why} ({check.points} needed, {check.points_left} left)."


def credits_stop(check: CreditsCheck | None, history: list[Any], turn: int) -> Stop | None:
    """The credits' verdict: a model call the owner cannot pay for ends the turn, with what
    the agent has so far and why."""
    if check is None or check.outcome != "insufficient":
        return None
    return Stop(
        trigger=Trigger.LIMIT_REACHED,
        stop_reason=StopReason.INSUFFICIENT_CREDITS,
        content=partial_answer(history, turn, note=credits_note(check)),
        reason=f"{StopReason.INSUFFICIENT_CREDITS}: the model call needs "
        f"{check.points} points, {check.points_left} left ({check.reason})",
        refused="credits",
    )


def tool_credits_stop(session: Session, credits: Verdict[None], step: int) -> Stop | None:
    """A tool step's credits verdict: the model was told once that a call could not be paid
    for and tried again, so the turn ends with what it has (`credits`: credits_reserve's)."""
    if not credits.settled or not insufficient_before(session, step):
        return None
    refused = next(iter(credits.settled.values())).output or {}
    return Stop(
        trigger=Trigger.LIMIT_REACHED,
        stop_reason=StopReason.INSUFFICIENT_CREDITS,
        content="I could not finish this: the next step needs "
        f"{refused.get('points_needed')} credit points and only "
        f"{refused.get('points_left')} are left.",
        reason="",
        refused="tool_credits",
    )


def model_points(model_calls: list[Any]) -> int:
    """The points these model calls cost on their endpoints (what their commit charges)."""
    return sum(
        model_call_points(
            tokens=call.input_tokens + call.output_tokens,
            credits_per_1k_tokens=call.endpoint.credits_per_1k_tokens,
        )
        for call in model_calls
        if call.endpoint is not None
    )


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
