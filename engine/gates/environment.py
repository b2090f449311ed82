"""Context drift (runtime-mechanisms 4.3): after a fork, a resume, a crash recovery or a
long pause, how far the world the model planned in has moved, and what is done about it.

- In a model step (`environment_note`): past `ENV_DRIFT_THRESHOLD`, a note lists what
  changed and asks the model to re-plan before any side effect. The note is in the
  request of that very step, so whatever the model decides next was decided seeing it.
- In a tool step (`drift_hold`): side-effecting calls the model decided before the pause
  are not sent when the drift is past the threshold; their result is the same note, so
  the model re-plans before anything happens.

The reference is what the session's latest checkpoints recorded: the environment (agent
configuration, tools, model: recorded when it changes; a fork copies its source's) and
what the model saw (`Seen`: recorded by every model step).
"""

from collections.abc import Sequence
from typing import Any, cast

from django.conf import settings

from engine.gates import Verdict
from engine.model.environment import (
    Drift,
    Seen,
    drift,
    model_paused,
    past_pause,
    seen_in_tool_step,
)
from memory.tokens import count_message_tokens
from record.models import Agent, Checkpoint, Message, Session, ToolCall, ToolCallStatus
from tools.execution import ToolOutcome, ToolSnapshot
from tools.rendering import render_failure


def recorded_drift(session: Session, env: dict[str, Any], seen: Seen | None) -> Drift:
    """Today's environment and `seen` against what the model saw at its latest step.

    The environment is the one in force at that step: a later tool step records a new
    one when it changed, but the model has not seen that one yet. A session with no
    `seen` recorded (a fork's first step) compares with the latest environment.
    """
    latest_seen = (
        Checkpoint.objects.filter(session=session, context__has_key="seen")
        .order_by("-step")
        .values_list("step", "context")
        .first()
    )
    envs = Checkpoint.objects.filter(session=session, context__has_key="env")
    if latest_seen is not None:
        envs = envs.filter(step__lte=latest_seen[0])
    recorded = envs.order_by("-step").values_list("context", flat=True).first()
    return drift(
        recorded["env"] if recorded else None,
        env,
        cast(Seen, latest_seen[1]["seen"]) if latest_seen else None,
        seen,
    )


def drift_text(found: Drift) -> str:
    return (
        "Note from the platform: since this conversation was paused, the situation changed: "
        + "; ".join(found.texts)
        + ". Re-plan from the current state before any action with side effects (a payment, "
        "a booking, a message sent): do not carry out a plan made before these changes "
        "without checking that it still fits."
    )


def environment_note(
    session: Session, env: dict[str, Any], seen: Seen | None, history: Sequence[Message]
) -> Verdict[None]:
    """After a fork, a resume, a crash recovery or a long pause, say what changed, when it
    changed enough (`ENV_DRIFT_THRESHOLD`)."""
    if not (session.resume_check or model_paused(history)):
        return Verdict()
    found = recorded_drift(session, env, seen)
    if not found.above(settings.ENV_DRIFT_THRESHOLD):
        return Verdict()
    text = drift_text(found)
    return Verdict.note(
        Message(
            turn=session.turn, role="system", content=text, token_count=count_message_tokens(text)
        )
    )


def drift_hold(
    session: Session,
    agent: Agent,
    calls: list[ToolCall],
    tools: dict[str, ToolSnapshot],
    env: dict[str, Any],
) -> Verdict[None]:
    """The side-effecting calls not to send (settled) because the world moved since the
    model decided them (after a resume, a crash recovery, or a pause longer than
    `ENV_CHECK_PAUSE_S` since the calls were decided).

    Only calls never dispatched: one that was (uncertain after a crash) is the probe's
    and the reviewers' (engine/gates/recovery.py).
    """
    held = [
        c
        for c in calls
        if c.dispatched_at is None
        and (tool := tools.get(c.tool_name)) is not None
        and tool.side_effects
    ]
    if not held:
        return Verdict()
    decided = min((c.created_at for c in held if c.created_at is not None), default=None)
    if not (session.resume_check or past_pause(decided)):
        return Verdict()
    found = recorded_drift(session, env, seen_in_tool_step(session, agent, tools))
    if not found.above(settings.ENV_DRIFT_THRESHOLD):
        return Verdict()
    message = "this call was not sent: " + drift_text(found).removeprefix(
        "Note from the platform: "
    )
    return Verdict(
        settled={
            c.pk: ToolOutcome(
                status=ToolCallStatus.REJECTED,
                output=None,
                error=message,
                content=render_failure(ToolCallStatus.REJECTED, message),
                extra={"drift": True},
            )
            for c in held
        }
    )
