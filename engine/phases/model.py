"""The model phase of a step: decide whether tools are still allowed, ask the
model (with fallback), and make the move its outcome calls for (an answer, or
tool-call intents)."""

import dataclasses
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone

from engine.gates import guards
from engine.gates.budget import gate_read, model_gate, model_rate_limit, partial_answer
from engine.gates.context_layers import context_layers
from engine.gates.guards import GuardLimits, GuardVerdict
from engine.gates.memory import wants_turn_memory
from engine.gates.metering import credits_note, model_credits_check, model_points
from engine.gates.revalidation import revalidation_note
from engine.model.calls import RunCancelled, call_model, primary_endpoint
from engine.model.context import LIMIT_NOTE, Assembly, assemble
from engine.model.environment import describe_changes
from engine.model.summaries import SummaryOutcome, summarise, summary_retry_at
from engine.model.usage import ModelSpend
from engine.moves.turn import ModelContext, answer, tool_intents, turn_cancel
from engine.run_cache import RunContext, agent_runtime, turn_calls_read
from llm.base import ModelConfigError
from memory.tokens import count_message_tokens
from observability import metrics, tracing
from observability.prompts import prompt_sample_record, sampled
from runtime.faults import fault_point
from sessions.dispatch import memory_enqueue_on_commit
from sessions.events import StopReason
from sessions.models import Agent, Checkpoint, Message, Session
from sessions.states import Trigger

LIMIT_ANSWER = "I stopped after the maximum number of tool rounds for one request."
BUSY_ANSWER = "The service is busy right now. Please try again in a moment."


def loop_stop(session: Session, agent: Agent, run: RunContext | None = None) -> GuardVerdict | None:
    """Why this turn may not call tools any more, if it may not.

    The iteration limit, the turn's time limit and the loop guards, judged
    from the turn's calls as the database holds them (kept in `run`'s memory
    between its own commits), so a re-run step reaches the same verdict.
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
    steps = run.turn_calls(session) if run is not None else turn_calls_read(session)
    limits = GuardLimits(
        repeat_limit=agent.repeat_call_limit, same_result_limit=agent.same_result_limit
    )
    return guards.check(steps, limits)


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


def request_window(agent: Agent, session: Session) -> int:
    """The tightest window among the agent's and the endpoints this step may call
    (the primary or rollout candidate, and the fallback it retries on)."""
    primary, _ = primary_endpoint(agent, session)
    windows = [agent.context_window, primary.context_window]
    fallback = agent.fallback_model
    if fallback is not None and fallback.enabled:
        windows.append(fallback.context_window)
    return min(windows)


def fitted_context(
    session: Session,
    agent: Agent,
    history: list[Message],
    *,
    tools: dict[str, Any],
    final: bool,
    note: str,
    window: int,
    memory_block: str = "",
    context_blocks: Sequence[str] = (),
) -> tuple[Assembly, SummaryOutcome]:
    """The step's request within the budget; past the summary watermark, with a new summary.

    1. Assemble (trimming what is not key).
    2. If the history passed its summary watermark (and no failed summary's
       wait is running): summarise the oldest third and assemble again with the
       summary at the head. A failed summary leaves the trimmed request of
       step 1: a summary never fails a turn.
    """
    assembly = assemble(
        agent=agent,
        history=history,
        tools=tools,
        final=final,
        note=note,
        window=window,
        memory_block=memory_block,
        context_blocks=context_blocks,
    )
    if not assembly.summarise or assembly.budget is None:
        return assembly, SummaryOutcome()
    retry_at = summary_retry_at(session)
    if retry_at is not None and timezone.now() < retry_at:
        return assembly, SummaryOutcome()  # trimmed until the failed summaries' wait ends
    outcome = summarise(
        session=session,
        agent=agent,
        messages=assembly.summarise,
        previous=assembly.previous_summary,
        tokens=max(assembly.usage["history_limit"] // 4, 64),
    )
    if outcome.message is None:
        return assembly, outcome
    history.append(outcome.message)
    again = assemble(
        agent=agent,
        history=history,
        tools=tools,
        final=final,
        note=note,
        window=window,
        summarise=False,
        memory_block=memory_block,
        context_blocks=context_blocks,
    )
    return again, outcome


def model_step(session: Session, owner: str, run: RunContext | None = None) -> None:
    """Ask the model (with fallback), then commit its answer or its tool calls (with their intent rows).

    1. Read the agent, its endpoints and tools fresh: edits in the admin or by
       apply_config take effect at the next step, without a restart.
    2. Judge the loop guards and limits; after a fork, resume or long pause,
       note what changed in the environment.
    3. Add the context layers (context_layers.py): the environment, the dialogue
       state (updated from the user's new messages) and this turn's extra_context.
    4. Assemble the request within the context budget; past the history's
       summary watermark, summarise its oldest third first (engine/model/summaries.py).
    5. Call the model (a cancel closes the stream); a call that waits on the
       network, or on the endpoint's rate limit, gives the database connection
       back first (model_calls.give_back_connection).
    6. Commit: the assistant message (with any summary and note), the ModelCall
       rows, usage and cost, the archived marks, the new dialogue state, and
       either the tool-call intents (-> tool_wait) or the end of the turn.
    """
    runtime = agent_runtime(session.agent_id, session)
    agent = runtime.agent
    run = run or RunContext()
    stop = loop_stop(session, agent, run)
    final = stop is not None
    tools = runtime.tools_for(session.role)
    env = runtime.environment(session.role)
    note = environment_note(session, env)
    history = run.history(session)
    memory_block = run.memory_block(session, agent, history)
    # After a resume or a fork: the tools' business-rule prechecks on their last calls.
    recheck = revalidation_note(session, history, tools)
    history.extend(n for n in (note, recheck) if n is not None)
    read = gate_read(session, agent, run.figures)
    layers = context_layers(session, agent, history, read, tools)
    context_blocks = tuple(layers.blocks)
    assembly, summary = fitted_context(
        session,
        agent,
        history,
        tools={} if final else tools,
        final=final,
        note=stop.note if stop else "",
        window=request_window(agent, session),
        memory_block=memory_block,
        context_blocks=context_blocks,
    )
    request = assembly.request
    request.agent_config.update(layers.config)
    # The engine's own model calls of this step (dialogue state, summary): committed with it.
    side_calls = layers.calls + summary.calls
    # What this step commits besides its outcome: the notes the model saw (an
    # environment change, a new summary) and the summary's model call.
    notes = [m for m in (summary.message, note, recheck) if m is not None]
    archive_through = (
        int(summary.message.data["through_seq"])
        if summary.message is not None and summary.message.data
        else None
    )
    tokens = dict(assembly.usage)
    deadline = (
        session.turn_started_at.timestamp() + agent.turn_timeout_s
        if session.turn_started_at
        else None
    )
    gate = model_gate(session, agent, request, read)
    request = gate.request
    if gate.endpoint.context_window < assembly.usage["window"]:
        # A degraded step goes to the cheaper model: fit its window too.
        smaller = assemble(
            agent=agent,
            history=history,
            tools={} if final else tools,
            final=final,
            note=stop.note if stop else "",
            window=gate.endpoint.context_window,
            summarise=False,
            memory_block=memory_block,
            context_blocks=context_blocks,
        )
        request = dataclasses.replace(request, messages=smaller.request.messages)
        tokens = dict(smaller.usage)

    def context_for(model: str | None) -> ModelContext:
        return ModelContext(
            env=env,
            model=model,
            deadline=deadline,
            notes=notes,
            degradation=gate.level,
            tokens=tokens,
            archive_through=archive_through,
            dialogue_state=layers.dialogue_state,
        )

    if not gate.verdict.allowed:
        metrics.BUDGET_REFUSALS.labels("budget").inc()
        answer(
            session,
            owner,
            content=partial_answer(history, session.turn),
            trigger=Trigger.LIMIT_REACHED,
            stop_reason=StopReason.BUDGET_EXCEEDED,
            spend=ModelSpend(calls=side_calls, iteration=session.iteration),
            context=context_for(None),
            reason=f"{StopReason.BUDGET_EXCEEDED}: {gate.verdict.message}",
        )
        return
    credits = model_credits_check(
        session,
        gate.endpoint,
        request,
        settings.BUDGET_OUTPUT_ESTIMATE_TOKENS,
        read.figures,
        run.figures.points_since,
    )
    if credits is not None and credits.outcome == "insufficient":
        metrics.BUDGET_REFUSALS.labels("credits").inc()
        answer(
            session,
            owner,
            content=partial_answer(history, session.turn, note=credits_note(credits)),
            trigger=Trigger.LIMIT_REACHED,
            stop_reason=StopReason.INSUFFICIENT_CREDITS,
            spend=ModelSpend(calls=side_calls, iteration=session.iteration),
            context=context_for(None),
            reason=f"{StopReason.INSUFFICIENT_CREDITS}: the model call needs "
            f"{credits.points} points, {credits.points_left} left ({credits.reason})",
        )
        return
    model_rate_limit(session, gate.endpoint, request)

    fault_point("before_model_call")
    iteration = session.iteration + 1
    tier = gate.endpoint if gate.endpoint.pk != agent.model_id else None
    try:
        routed = call_model(session, agent, request, tier=tier)
        # Taken by this step's commit: the run's kept credit figures count them from now.
        run.figures.spent_points(model_points(summary.calls + routed.calls))
    except RunCancelled as cancelled:
        # The stream was closed by a cancel: the turn ends cancelled, keeping what the call used.
        fresh = Session.objects.get(pk=session.pk)
        spent = ModelSpend(calls=side_calls + cancelled.calls, iteration=iteration, answered=False)
        turn_cancel(session=fresh, owner=owner, spend=spent)
        return
    spend = ModelSpend(calls=side_calls + routed.calls, iteration=iteration)
    context = context_for(routed.endpoint.name if routed.endpoint else None)
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
    if sampled():
        call = routed.calls[-1]
        prompt_sample_record(
            session_id=session.pk,
            turn=session.turn,
            iteration=iteration,
            endpoint=call.endpoint_name,
            model=call.model,
            trace_id=tracing.trace_id_of(session.trace_parent),
            request=request,
            response=response,
            input_tokens=call.input_tokens or 0,
            output_tokens=call.output_tokens or 0,
        )
    tool_calls = [] if final else response.tool_calls
    if not tool_calls:
        content = response.text
        if final and not content.strip():
            content = LIMIT_ANSWER
        turn = session.turn
        answer(
            session,
            owner,
            content=content,
            trigger=Trigger.LIMIT_REACHED if final else Trigger.ANSWER,
            stop_reason=stop.stop_reason if stop else StopReason.ANSWER,
            spend=spend,
            context=context,
        )
        user_text = "\n".join(m.content for m in history if m.role == "user" and m.turn == turn)
        if wants_turn_memory(agent, user_text):
            memory_enqueue_on_commit(session.pk, turn)
        return
    tool_intents(
        session,
        owner,
        text=response.text,
        tool_calls=list(tool_calls),
        spend=spend,
        context=context,
    )
