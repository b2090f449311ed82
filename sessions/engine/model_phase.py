"""The model phase of a step: decide whether tools are still allowed, ask the
model (with fallback), and commit its answer or its tool-call intents."""

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import connection
from django.utils import timezone

from llm.base import ModelConfigError
from memory.tokens import count_message_tokens
from runtime.faults import fault_point

from ..models import Agent, Checkpoint, Message, Session, ToolCall
from ..rows import json_value
from ..states import RUNNABLE, State, Trigger
from . import guards
from .commit import StaleSession, step_commit
from .context import LIMIT_NOTE, build_request, tool_calls_json
from .environment import describe_changes, environment
from .guards import CallRecord, GuardLimits, GuardVerdict, canonical_json
from .model_calls import RunCancelled, call_model
from .runtime_cache import RunContext, agent_runtime
from .steps import build_step, cancel_stop_reason, finish_turn, turn_summary

LIMIT_ANSWER = "I stopped after the maximum number of tool rounds for one request."
BUSY_ANSWER = "The service is busy right now. Please try again in a moment."


def loop_stop(session: Session, agent: Agent) -> GuardVerdict | None:
    """Why this turn may not call tools any more, if it may not.

    The iteration limit, the turn's time limit and the loop guards, judged
    from what the database holds, so a re-run step reaches the same verdict.
    """
    if session.iteration >= agent.max_iterations:
        return GuardVerdict("max_iterations", LIMIT_NOTE)
    if session.turn_started_at is not None:
        elapsed = (timezone.now() - session.turn_started_at).total_seconds()
        if elapsed > agent.turn_timeout_s:
            return GuardVerdict(
                "turn_timeout",
                f"This request has run for {int(elapsed)} s, past its limit of {agent.turn_timeout_s:g} s.",
            )
    if session.iteration < 2:
        return None
    steps: dict[int, list[CallRecord]] = {}
    with connection.cursor() as cursor:
        cursor.execute(
            f'SELECT step, tool_name, input, output, status FROM "{ToolCall._meta.db_table}" '
            "WHERE session_id = %s AND turn = %s ORDER BY step, position",
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
    runtime = agent_runtime(session.agent_id)
    agent = runtime.agent
    stop = loop_stop(session, agent)
    final = stop is not None
    tools = runtime.tools_for(session.role)
    env = environment(agent, tools, agent.model.name)
    note = environment_note(session, env)
    history = (run or RunContext()).history(session)
    if note is not None:
        history.append(note)
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
    connection.close()  # never hold a connection across the model call

    fault_point("before_model_call")
    try:
        routed = call_model(session, agent, request)
    except RunCancelled as cancelled:
        fresh = Session.objects.get(pk=session.pk)
        spent = {
            "add_fields": cancelled.usage_fields(),
            "model_calls": cancelled.calls,
            "set_fields": {"iteration": session.iteration + 1},
        }
        finish_turn(
            fresh,
            owner,
            Trigger.CANCEL,
            fresh.cancel_reason or "cancel requested",
            stop_reason=cancel_stop_reason(fresh),
            actor=fresh.cancel_actor,
            extra=spent,
        )
        return
    usage: dict[str, Any] = {
        "add_fields": {
            "input_tokens": routed.input_tokens,
            "output_tokens": routed.output_tokens,
            "cost": routed.cost,
        },
        "model_calls": routed.calls,
        "set_fields": {"iteration": session.iteration + 1, "resume_check": False},
    }
    used = routed.endpoint.name if routed.endpoint else None
    notes = [note] if note is not None else []
    common = {"env": env, "checkpoint": {"model": used, "deadline": deadline}}
    if routed.response is None:
        error = routed.error
        problem = str(error) if error else "model call failed"
        # The user gets the busy message either way; a refusal (a 4xx such as an
        # unknown model, a missing key) is told apart for the operator, who also
        # finds the reason in the ModelCall rows, last_error, the transition and the log.
        refused = isinstance(error, ModelConfigError)
        stop_reason = "model_refused" if refused else "model_unavailable"
        _answer(
            session,
            owner,
            agent.busy_message or BUSY_ANSWER,
            Trigger.ANSWER,
            stop_reason,
            usage,
            common,
            notes,
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
        trigger = Trigger.LIMIT_REACHED if final else Trigger.ANSWER
        _answer(
            session,
            owner,
            content,
            trigger,
            stop.stop_reason if stop else "answer",
            usage,
            common,
            notes,
        )
        return

    step_no = session.step + 1
    calls = [
        ToolCall(
            turn=session.turn,
            step=step_no,
            position=position,
            # Column limits: a model may send anything; the tool layer rejects the
            # odd name with a clear result rather than the step crashing on it.
            call_id=call.id[:100],
            tool_name=call.name[:100],
            input=call.arguments,
            error=call.arguments_error or "",
            # Stable per logical call: a re-run of this step reuses the stored row and key.
            idempotency_key=f"{session.pk}:{session.turn}:{step_no}:{position}:{call.name[:100]}",
        )
        for position, call in enumerate(tool_calls)
    ]
    message = Message(
        turn=session.turn,
        role="assistant",
        content=response.text,
        tool_calls=tool_calls_json(tool_calls),
        token_count=count_message_tokens(
            response.text, canonical_json(tool_calls_json(tool_calls))
        ),
    )
    checkpoint = {
        **common["checkpoint"],
        "pending": [[c.call_id, c.idempotency_key] for c in calls],
    }
    step_commit(
        build_step(
            session,
            owner,
            trigger=Trigger.TOOL_CALLS,
            phase="tool_intent",
            reason=", ".join(c.tool_name for c in calls),
            messages=[*notes, message],
            new_tool_calls=calls,
            after_events=[
                (
                    "tool.started",
                    {"call_id": c.call_id, "tool": c.tool_name, "input": c.input, "turn": c.turn},
                )
                for c in calls
            ],
            env=env,
            checkpoint=checkpoint,
            **usage,
        )
    )


def _answer(
    session: Session,
    owner: str,
    content: str,
    trigger: Trigger,
    stop_reason: str,
    usage: dict[str, Any],
    common: dict[str, Any],
    notes: list[Message],
    last_error: str = "",
    reason: str = "",
) -> None:
    message = Message(
        turn=session.turn,
        role="assistant",
        content=content,
        token_count=count_message_tokens(content),
    )
    add = usage["add_fields"]
    summary = turn_summary(
        session,
        stop_reason,
        add["input_tokens"],
        add["output_tokens"],
        add["cost"],
        iterations=usage["set_fields"]["iteration"],
    )
    try:
        step_commit(
            build_step(
                session,
                owner,
                trigger=trigger,
                phase="answer",
                reason=reason or stop_reason,
                messages=[*notes, message],
                after_events=[("turn.finished", summary)],
                env=common["env"],
                checkpoint=common["checkpoint"],
                add_fields=add,
                model_calls=usage["model_calls"],
                set_fields={**usage["set_fields"], "last_error": last_error[:2000]},
                unless_cancel_requested=True,
            )
        )
    except StaleSession:
        # An interrupt arrived while the model answered: the turn ends cancelled
        # (the call's usage is kept); any other conflict goes to the run loop.
        fresh = Session.objects.filter(
            pk=session.pk, lease_owner=owner, cancel_requested=True
        ).first()
        if fresh is None or State(fresh.state) not in RUNNABLE:
            raise
        finish_turn(
            fresh,
            owner,
            Trigger.CANCEL,
            fresh.cancel_reason or "cancel requested",
            stop_reason=cancel_stop_reason(fresh),
            actor=fresh.cancel_actor,
            extra=usage,
        )
