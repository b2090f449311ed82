"""The model phase of a step: decide whether tools are still allowed, ask the
model (with fallback), and make the move its outcome calls for (an answer, or
tool-call intents)."""

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import connection
from django.utils import timezone

from llm.base import ModelConfigError
from memory.tokens import count_message_tokens
from runtime.faults import fault_point

from ..events import StopReason
from ..models import Agent, Checkpoint, Message, Session, ToolCall
from ..rows import json_value
from ..states import Trigger
from . import guards
from .budget_gate import model_gate, model_rate_limit, partial_answer
from .context import LIMIT_NOTE, build_request
from .environment import describe_changes, environment
from .guards import CallRecord, GuardLimits, GuardVerdict
from .metering import credits_note, model_credits_check
from .model_calls import RunCancelled, call_model
from .moves import ModelContext, answer, tool_intents, turn_cancel
from .revalidation import revalidation_note
from .runtime_cache import RunContext, agent_runtime
from .usage import ModelSpend

LIMIT_ANSWER = "I stopped after the maximum number of tool rounds for one request."
BUSY_ANSWER = "The service is busy right now. Please try again in a moment."


def loop_stop(session: Session, agent: Agent) -> GuardVerdict | None:
    """Why this turn may not call tools any more, if it may not.

    The iteration limit, the turn's time limit and the loop guards, judged
    from what the database holds, so a re-run step reaches the same verdict.
    """
    if session.iteration >= agent.max_iterations:
        return GuardVerdict(StopReason.MAX_ITERATIONS, LIMIT_NOTE)
    if session.turn_started_at is not None:
        elapsed = (timezone.now() - session.turn_started_at).total_seconds()
        if elapsed > agent.turn_timeout_s:
            return GuardVerdict(
                StopReason.TURN_TIMEOUT,
                f"This request has run for {int(elapsed)} s, past its limit of {agent.turn_timeout_s:g} s.",
            )
    if session.iteration < 2:
        return None
    steps: dict[int, list[CallRecord]] = {}
    with connection.cursor() as cursor:
        cursor.execute(
            # SQL names from model metadata (constants); every value is a bound parameter.
            f'SELECT step, tool_name, input, output, status FROM "{ToolCall._meta.db_table}" '
            "WHERE session_id = %s AND turn = %s ORDER BY step, position",  # nosec B608
            [session.pk, session.turn],
        )
        for step, name, raw_input, raw_output, status in cursor.fetchall():
            steps.setdefault(step, []).append(
                CallRecord(name, json_value(raw_input), json_value(raw_output), status)
            )
    limits = GuardLimits(
        repeat_limit=agent.repeat_call_limit, same_result_limit=agent.same_result_limit
    )
    return guards.check(list(steps.values()), limits)


def environment_note(session: Session, env: dict[str, Any]) -> Message | None:
    """After a fork, a resume or a long pause, say what changed in the environment.

    The reference is the environment recorded by the session's latest
    checkpoint that recorded one (a fork copies its source's).
    """
    # The row's updated_at is the last step's commit: no query to tell a pause.
    paused = session.updated_at is not None and timezone.now() - session.updated_at > timedelta(
        seconds=settings.ENV_CHECK_PAUSE_S
    )
    if not (session.resume_check or paused):
        return None
    recorded = (
        Checkpoint.objects.filter(session=session, context__has_key="env")
        .order_by("-step")
        .values_list("context", flat=True)
        .first()
    )
    if not recorded:
        return None
    changes = describe_changes(recorded["env"], env)
    if not changes:
        return None
    text = (
        "Note from the platform: since this conversation was paused, "
        + "; ".join(changes)
        + ". Take this into account."
    )
    return Message(
        turn=session.turn, role="system", content=text, token_count=count_message_tokens(text)
    )


def model_step(session: Session, owner: str, run: RunContext | None = None) -> None:
    """Ask the model (with fallback), then commit its answer or its tool calls (with their intent rows).

    1. Read the agent, its endpoints and tools fresh: edits in the admin or by
       apply_config take effect at the next step, without a restart.
    2. Judge the loop guards and limits; after a fork, resume or long pause,
       note what changed in the environment.
    3. Give the database connection back, then call the model (a cancel
       closes the stream).
    4. Commit: the assistant message, the ModelCall rows, usage and cost, and
       either the tool-call intents (-> tool_wait) or the end of the turn.
    """
    runtime = agent_runtime(session.agent_id, session)
    agent = runtime.agent
    stop = loop_stop(session, agent)
    final = stop is not None
    tools = runtime.tools_for(session.role)
    env = environment(agent, tools, agent.model.name)
    note = environment_note(session, env)
    history = (run or RunContext()).history(session)
    # After a resume or a fork: the tools' business-rule prechecks on their last calls.
    recheck = revalidation_note(session, history, tools)
    notes = [n for n in (note, recheck) if n is not None]
    history.extend(notes)
    request = build_request(
        agent=agent,
        history=history,
        tools={} if final else tools,
        final=final,
        note=stop.note if stop else "",
    )
    deadline = (
        session.turn_started_at.timestamp() + agent.turn_timeout_s
        if session.turn_started_at
        else None
    )
    gate = model_gate(session, agent, request)
    request = gate.request
    if not gate.verdict.allowed:
        answer(
            session,
            owner,
            content=partial_answer(history, session.turn),
            trigger=Trigger.LIMIT_REACHED,
            stop_reason=StopReason.BUDGET_EXCEEDED,
            spend=ModelSpend(iteration=session.iteration),
            context=ModelContext(
                env=env, model=None, deadline=deadline, notes=[], degradation=gate.level
            ),
            reason=f"{StopReason.BUDGET_EXCEEDED}: {gate.verdict.message}",
        )
        return
    credits = model_credits_check(
        session, gate.endpoint, request, settings.BUDGET_OUTPUT_ESTIMATE_TOKENS
    )
    if credits is not None and credits.outcome == "insufficient":
        answer(
            session,
            owner,
            content=partial_answer(history, session.turn, note=credits_note(credits)),
            trigger=Trigger.LIMIT_REACHED,
            stop_reason=StopReason.INSUFFICIENT_CREDITS,
            spend=ModelSpend(iteration=session.iteration),
            context=ModelContext(
                env=env, model=None, deadline=deadline, notes=[], degradation=gate.level
            ),
            reason=f"{StopReason.INSUFFICIENT_CREDITS}: the model call needs "
            f"{credits.points} points, {credits.points_left} left ({credits.reason})",
        )
        return
    connection.close()  # never hold a connection across the model call
    model_rate_limit(session, gate.endpoint, request)

    fault_point("before_model_call")
    iteration = session.iteration + 1
    tier = gate.endpoint if gate.endpoint.pk != agent.model_id else None
    try:
        routed = call_model(session, agent, request, tier=tier)
    except RunCancelled as cancelled:
        # The stream was closed by a cancel: the turn ends cancelled, keeping what the call used.
        fresh = Session.objects.get(pk=session.pk)
        spent = ModelSpend(calls=cancelled.calls, iteration=iteration, answered=False)
        turn_cancel(session=fresh, owner=owner, spend=spent)
        return
    spend = ModelSpend(calls=routed.calls, iteration=iteration)
    context = ModelContext(
        env=env,
        model=routed.endpoint.name if routed.endpoint else None,
        deadline=deadline,
        notes=notes,
        degradation=gate.level,
    )
    if routed.response is None:
        error = routed.error
        problem = str(error) if error else "model call failed"
        # The user gets the busy message either way; a refusal (a 4xx such as an
        # unknown model, a missing key) is told apart for the operator, who also
        # finds the reason in the ModelCall rows, last_error, the transition and the log.
        refused = isinstance(error, ModelConfigError)
        stop_reason = StopReason.MODEL_REFUSED if refused else StopReason.MODEL_UNAVAILABLE
        answer(
            session,
            owner,
            content=agent.busy_message or BUSY_ANSWER,
            trigger=Trigger.ANSWER,
            stop_reason=stop_reason,
            spend=spend,
            context=context,
            last_error=problem,
            reason=f"{stop_reason}: {problem}" if refused else "",
        )
        return

    response = routed.response
    tool_calls = [] if final else response.tool_calls
    if not tool_calls:
        content = response.text
        if final and not content.strip():
            content = LIMIT_ANSWER
        answer(
            session,
            owner,
            content=content,
            trigger=Trigger.LIMIT_REACHED if final else Trigger.ANSWER,
            stop_reason=stop.stop_reason if stop else StopReason.ANSWER,
            spend=spend,
            context=context,
        )
        return
    tool_intents(
        session,
        owner,
        text=response.text,
        tool_calls=list(tool_calls),
        spend=spend,
        context=context,
    )
