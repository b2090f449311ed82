"""Building blocks every phase of the run uses: the Step with its lease guard
and delta checkpoint, starting a turn, and ending one."""

from decimal import Decimal
from typing import Any

from django.conf import settings
from django.utils import timezone

from memory.tokens import count_message_tokens
from tools.rendering import render_failure

from ..models import Message, MessageStatus, Session, ToolCall, ToolCallStatus
from ..states import Trigger
from .commit import Step, step_commit
from .environment import fingerprint as env_fingerprint

INTERRUPT_REASON = "interrupted by a new message"


def build_step(
    session: Session,
    owner: str | None,
    *,
    trigger: Trigger | None,
    phase: str,
    env: dict[str, Any] | None = None,
    **kwargs: Any,
) -> Step:
    """A Step with the lease guard, lease renewal and a delta checkpoint.

    The checkpoint holds only what this step changed (turn, iteration, phase,
    the calls it opened or closed, the model it used) and the environment
    when it differs from the previous step's.
    """
    set_fields = kwargs.setdefault("set_fields", {})
    checkpoint: dict[str, Any] = {
        "turn": set_fields.get("turn", session.turn),
        "iteration": set_fields.get("iteration", session.iteration),
        "phase": phase,
        **kwargs.pop("checkpoint", {}),
    }
    fingerprint = ""
    if env is not None:
        fingerprint = env_fingerprint(env)
        if fingerprint != session.env_fingerprint:
            checkpoint["env"] = env
            set_fields.setdefault("env_fingerprint", fingerprint)
    return Step(
        session=session,
        trigger=trigger,
        lease_owner=owner,
        lease_seconds=settings.SESSION_LEASE_S if owner else settings.SESSION_PICKUP_GRACE_S,
        checkpoint=checkpoint,
        fingerprint=fingerprint or session.env_fingerprint,
        **kwargs,
    )


def turn_start(
    *, session: Session, lease_owner: str | None, message: Message | None = None
) -> bool:
    """Start the next turn: with the oldest queued user message, or with
    `message`, a new one that was never queued (it is inserted by this step)."""
    fresh = message is not None
    if message is None:
        message = (
            Message.objects.filter(session=session, status=MessageStatus.QUEUED)
            .order_by("id")
            .first()
        )
    if message is None:
        return False
    turn = session.turn + 1
    if fresh:
        message.turn = turn
    step_commit(
        build_step(
            session,
            lease_owner,
            trigger=Trigger.USER_MESSAGE,
            phase="turn_start",
            reason=f"turn {turn}",
            activate_message=None if fresh else message,
            messages=[message] if fresh else [],
            set_fields={
                "turn": turn,
                "iteration": 0,
                "cancel_requested": False,
                "cancel_reason": "",
                "cancel_actor": "",
                "last_error": "",
                "turn_started_at": timezone.now(),
            },
            add_fields={} if fresh else {"queued_count": -1},
            checkpoint={"message_seq": session.message_seq + 1},
        )
    )
    return True


def turn_summary(
    session: Session,
    stop_reason: str,
    input_tokens: int = 0,
    output_tokens: int = 0,
    cost: Decimal = Decimal(0),
    iterations: int | None = None,
) -> dict[str, Any]:
    return {
        "turn": session.turn,
        "stop_reason": stop_reason,
        # Model calls in this turn, counting the one this step commits.
        "iterations": session.iteration if iterations is None else iterations,
        "usage": {
            "input_tokens": session.input_tokens + input_tokens,
            "output_tokens": session.output_tokens + output_tokens,
            "cost": str(session.cost + cost),
        },
    }


def finish_turn(
    session: Session,
    owner: str | None,
    trigger: Trigger,
    reason: str,
    *,
    stop_reason: str,
    error: str = "",
    actor: str = "",
    extra: dict[str, Any] | None = None,
) -> None:
    """End the turn (cancelled, error, ...) with its events, in one step.

    Calls of the turn that never started are closed as rejected, so no
    ToolCall is left `executing` once its turn is over. Each closed call also
    gets its tool result message saying so: the history stays well formed (a
    model API refuses tool calls without results) and a resumed run, or the
    next turn, tells the model what became of the call.
    """
    extra = extra or {}
    events: list[tuple[str, dict[str, Any]]] = []
    if error:
        code = "model_error" if trigger == Trigger.FAILURE else stop_reason
        events.append(("error", {"code": code, "message": error[:500]}))
    add = extra.get("add_fields", {})
    summary = turn_summary(
        session,
        stop_reason,
        add.get("input_tokens", 0),
        add.get("output_tokens", 0),
        add.get("cost", Decimal(0)),
        iterations=extra.get("set_fields", {}).get("iteration"),
    )
    open_calls = list(
        ToolCall.objects.filter(
            session=session, turn=session.turn, status=ToolCallStatus.EXECUTING
        ).order_by("step", "position")
    )
    now = timezone.now()
    for call in open_calls:
        call.status = (
            ToolCallStatus.REJECTED if call.dispatched_at is None else ToolCallStatus.FAILED
        )
        call.error = (
            f"the turn ended ({stop_reason}) before this call ran"
            if call.dispatched_at is None
            else f"the turn ended ({stop_reason}) while this call was in flight; its outcome is unknown "
            f"(idempotency key {call.idempotency_key})"
        )
        call.finished_at = now
    results = [_closed_call_result(session, call) for call in open_calls]
    events[:0] = [
        (
            "tool.finished",
            {
                "call_id": c.call_id,
                "tool": c.tool_name,
                "status": c.status,
                "error": c.error,
                "turn": c.turn,
            },
        )
        for c in open_calls
    ]
    step_commit(
        build_step(
            session,
            owner,
            trigger=trigger,
            phase=stop_reason,
            reason=reason,
            actor=actor,
            messages=results,
            events=events,
            updated_tool_calls=open_calls,
            after_events=[("turn.finished", {**summary, "reason": reason})],
            set_fields={
                **extra.get("set_fields", {}),
                "cancel_requested": False,
                "cancel_reason": "",
                "cancel_actor": "",
                "timer_due_at": None,
                "timer_note": "",
                "last_error": error[:2000],
            },
            add_fields=extra.get("add_fields", {}),
            model_calls=extra.get("model_calls", []),
        )
    )


def _closed_call_result(session: Session, call: ToolCall) -> Message:
    content = render_failure(call.status, call.error)
    return Message(
        turn=session.turn,
        role="tool",
        content=content,
        tool_call_id=call.call_id,
        name=call.tool_name,
        data={"error": call.error, "status": call.status},
        token_count=count_message_tokens(content),
    )


def cancel_stop_reason(session: Session) -> str:
    return "interrupted" if session.cancel_reason == INTERRUPT_REASON else "cancelled"


def turn_cancel(*, session: Session, reason: str, actor: str = "") -> None:
    """Cancel a turn no worker is running (waiting on a person or a clock)."""
    stop = "interrupted" if reason == INTERRUPT_REASON else "cancelled"
    finish_turn(session, None, Trigger.CANCEL, reason, stop_reason=stop, actor=actor)
