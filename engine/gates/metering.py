"""Metering in the step loop, the gate: credit points before tool and model calls.

- Before a tool that costs points runs, its points are reserved (billing),
  keyed by the call's idempotency key: a re-run after a crash finds its
  reservation and is not charged again. A call the account cannot pay for does
  not run; the model gets a result with `insufficient_credits`, the points
  needed and left. A call whose points are held by in-flight calls waits
  (`CreditsWait`: the run gives its lease back for a moment and holds no worker).
- A model call on an endpoint with `credits_per_1k_tokens` is checked before it
  runs (engine/model/credits.py: its estimated tokens must fit the free balance and
  today's cap, else the turn ends with `insufficient_credits`).
- What the step's commit settles, releases, rolls up and charges is the moves' (engine/
  moves/metering.py).
"""

from typing import Any

from billing.pricing import model_call_points
from billing.selectors import CreditsCheck
from billing.services import (
    Reservation,
    credit_reserve_statement,
    reservation_of,
)
from engine.gates import Stop, Verdict, partial_answer
from engine.model.credits import INSUFFICIENT
from record.events import EventSpec, EventType, Progress, StopReason
from record.models import Refusal, Session, ToolCall, ToolCallStatus
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


def credits_note(check: CreditsCheck) -> str:
    why = (
        "today's credit cap is reached" if check.reason == "daily_cap" else "credit points ran out"
    )
    if check.reason == "no_account":
        why = "there is no credit account for this user"
    return f"I had to stop here: {why} ({check.points} needed, {check.points_left} left)."


def credits_stop(check: CreditsCheck | None, history: list[Any], turn: int) -> Verdict[None]:
    """The credits' verdict: a model call the owner cannot pay for ends the turn, with what
    the agent has so far and why."""
    if check is None or check.outcome != "insufficient":
        return Verdict()
    return Verdict(
        stop=Stop(
            trigger=Trigger.LIMIT_REACHED,
            stop_reason=StopReason.INSUFFICIENT_CREDITS,
            content=partial_answer(history, turn, note=credits_note(check)),
            reason=f"{StopReason.INSUFFICIENT_CREDITS}: the model call needs "
            f"{check.points} points, {check.points_left} left ({check.reason})",
            refused="credits",
        )
    )


def tool_credits_stop(session: Session, credits: Verdict[None], step: int) -> Verdict[None]:
    """A tool step's credits verdict: the model was told once that a call could not be paid
    for and tried again, so the turn ends with what it has (`credits`: credits_reserve's)."""
    if not credits.settled or not insufficient_before(session, step):
        return Verdict()
    refused = next(iter(credits.settled.values())).output or {}
    return Verdict(
        stop=Stop(
            trigger=Trigger.LIMIT_REACHED,
            stop_reason=StopReason.INSUFFICIENT_CREDITS,
            content="I could not finish this: the next step needs "
            f"{refused.get('points_needed')} credit points and only "
            f"{refused.get('points_left')} are left.",
            reason="",
            refused="tool_credits",
        )
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
