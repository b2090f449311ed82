"""The model phase of a step: the gates that shape the request (`model_plan`), the gates
that may stop the turn, the model call (with fallback), and the one move its outcome
calls for (an answer, tool-call intents, or the cancel)."""

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.utils import timezone

from billing.services import notices_raise
from engine.gates import Contribution, Verdict, guards
from engine.gates.budget import (
    GateRead,
    ModelGate,
    budget_hold,
    budget_stop,
    called_endpoint,
    degraded_tier,
    gate_read,
    hold_carried,
    model_gate,
    model_rate_limit,
)
from engine.gates.context_layers import context_layers
from engine.gates.environment import environment_note
from engine.gates.guards import GuardLimits, GuardVerdict, calls_note
from engine.gates.memory import wants_turn_memory
from engine.gates.metering import credits_stop, model_points
from engine.gates.revalidation import revalidation
from engine.gates.routing import MAIN, SMALL, Route, escalation, route
from engine.gates.turn_options import (
    answer_format_block,
    turn_called_tools,
    turn_options,
    with_turn_options,
)
from engine.model.calls import (
    Routed,
    RunCancelled,
    call_model,
    request_tokenizer,
    request_window,
    tiers_record,
)
from engine.model.context import LIMIT_NOTE, Assembly, assemble
from engine.model.credits import model_credits_check
from engine.model.structured import answer_check, repair_messages
from engine.model.summaries import (
    SummaryOutcome,
    summarise,
    summary_ahead_wanted,
    summary_draft_use,
    summary_retry_at,
)
from engine.model.usage import ModelSpend
from engine.moves.turn import ModelContext, answer, tool_intents, turn_cancel
from engine.run_cache import RunContext, agent_runtime, turn_calls_read
from llm.base import ModelConfigError, ModelError
from llm.types import ChatRequest, ChatResponse
from memory.services import memory_touch
from memory.tokens import Tokenizer
from observability import metrics, tracing
from observability.prompts import prompt_sample_record, sampled
from record.dispatch import memory_enqueue_on_commit, summary_ahead_enqueue_on_commit
from record.events import CallCounts, EventType, Progress, StopReason
from record.models import Agent, Message, ModelCall, ModelEndpoint, Session
from record.publisher import publish_ephemeral
from record.states import Trigger
from runtime.faults import fault_point

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
    return guards.check(steps, limits).intent


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
    tokenizer: Tokenizer | None = None,
) -> tuple[Assembly, SummaryOutcome]:
    """The step's request within the budget; past the summary watermark, with a new summary.

    1. Assemble (trimming what is not key).
    2. If the history passed its summary watermark: the summary made ahead if one
       is ready for it, else (and no failed summary's wait is running) summarise the
       oldest third now; then assemble again with the summary at the head. A failed
       summary leaves the trimmed request of step 1: a summary never fails a turn.
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
        tokenizer=tokenizer,
    )
    if not assembly.summarise or assembly.budget is None:
        return assembly, SummaryOutcome()
    tokens = max(assembly.usage["history_limit"] // 4, 64)
    prepared = summary_draft_use(session, assembly, tokens)
    if prepared is not None:
        outcome = SummaryOutcome(message=prepared)  # made ahead: no model call in this step
    else:
        retry_at = summary_retry_at(session)
        if retry_at is not None and timezone.now() < retry_at:
            return assembly, SummaryOutcome()  # trimmed until the failed summaries' wait ends
        outcome = summarise(
            session=session,
            agent=agent,
            messages=assembly.summarise,
            previous=assembly.previous_summary,
            tokens=tokens,
            tokenizer=tokenizer,
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
        tokenizer=tokenizer,
    )
    return again, outcome


@dataclass
class ModelPlan:
    """A model step's request and what rides with it, once the gates that shape it ran."""

    agent: Agent
    history: list[Message]
    final: bool  # the loop guards or limits allow no more tool calls
    stop: GuardVerdict | None
    added: Contribution  # the contributing gates' notes, blocks, calls, dialogue state
    summary: SummaryOutcome
    request: ChatRequest  # fitted to the window and tokenizer of the endpoints it may go to
    gate: ModelGate  # the budget's degradation level, endpoint and verdict
    read: GateRead
    way: Route  # model routing: the small model, or the agent's own
    tokens: dict[str, int]
    env: dict[str, Any]
    archive_through: int | None
    # The client's own tools offered in this step (the OpenAI-compatible request's `tools`).
    client_tools: frozenset[str] = frozenset()
    # Past the ahead watermark: prepare the next summary once this step commits.
    summary_ahead: bool = False

    def context(self, session: Session, model: str | None) -> ModelContext:
        """What the step's move commits besides its outcome."""
        return ModelContext(
            env=self.env,
            model=model,
            deadline=(
                session.turn_started_at.timestamp() + self.agent.turn_timeout_s
                if session.turn_started_at
                else None
            ),
            # The notes the model saw: a new summary, then the contributing gates' notes.
            notes=[m for m in (self.summary.message, *self.added.notes) if m is not None],
            degradation=self.gate.level,
            tokens=self.tokens,
            archive_through=self.archive_through,
            dialogue_state=self.added.dialogue_state,
            seen=dict(self.added.seen) if self.added.seen is not None else None,
        )

    @property
    def side_calls(self) -> list[Any]:
        """The engine's own model calls of this step (dialogue state, summary)."""
        return [*self.added.calls, *self.summary.calls]


def model_plan(session: Session, run: RunContext) -> ModelPlan:
    """The request, shaped by the gates that contribute to it.

    1. Read the agent, its endpoints and tools fresh (the run cache validates them by
       their stamp): edits in the admin or by apply_config take effect at the next step.
    2. The loop guards and limits: may make the step final (no more tools).
    3. The contributing gates: the context layers (the environment, the dialogue state,
       the turn's extra_context; what the model sees of its situation), then the notes
       appended to the history: what changed since a pause, a resume, a fork or a crash
       recovery when it changed enough (the drift, against the layers just made),
       preconditions checked again; and the answer's form when the turn's client asked
       for one; the client's sampling settings (`turn_options`) go on the request.
    4. Where the call goes: the degraded tier (the budget gate's level), else the routed
       small model, else the agent's model or rollout candidate.
    5. Assemble within the context budget of the endpoints the step may call (their
       tightest window, counted with their tokenizers); past the summary watermark, the
       summary made ahead or summarise the oldest third now (engine/model/summaries.py).
    6. The budget gate prices the call at the endpoint it goes to.
    """
    runtime = agent_runtime(session.agent_id, session)
    agent = runtime.agent
    stop = loop_stop(session, agent, run)
    final = stop is not None
    tools = runtime.tools_for(session.role)
    env = runtime.environment(session.role)
    history = run.history(session)
    memory = run.memory_block(session, agent, history)
    memory_touch(item_ids=list(memory.used))  # the items placed (the admin's "last used")
    read = gate_read(session, agent, run.figures)
    # The crossings the gate found: an insert only at a new one (none while none is new
    # to this process), outside the step's commit so a refused step still tells operators.
    notices_raise(read.notices)
    # The layers first: the drift check compares what the model is about to see.
    layers = context_layers(session, agent, history, read, tools)
    notes = Verdict.joined(
        environment_note(session, env, layers.contribution.seen, history),
        revalidation(session, history, tools),
        calls_note(session, history, lambda: run.turn_calls(session)),
    )
    history.extend(notes.notes)
    options = turn_options(history, session.turn)
    added = Contribution.join(notes, layers.contribution, answer_format_block(options).contribution)
    way = route(session, agent, history, degraded_tier(agent, read.level) is not None)
    called, _tier = called_endpoint(session, agent, read.level, way.endpoint)
    assembly, summary = fitted_context(
        session,
        agent,
        history,
        tools={} if final else tools,
        final=final,
        note=stop.note if stop else "",
        window=request_window(agent, session, called),
        memory_block=memory.text,
        context_blocks=added.blocks,
        tokenizer=request_tokenizer(agent, session, called),
    )
    request = with_turn_options(
        assembly.request,
        options,
        agent.model,
        final=final,
        called=options is not None and turn_called_tools(history, session.turn),
    )
    request.agent_config.update(added.config)
    tokens = dict(assembly.usage)
    gate = model_gate(session, agent, request, read, chosen=way.endpoint)
    request = gate.request
    return ModelPlan(
        agent=agent,
        history=history,
        final=final,
        stop=stop,
        added=added,
        summary=summary,
        request=request,
        gate=gate,
        read=read,
        way=way,
        tokens=tokens,
        env=env,
        archive_through=(
            int(summary.message.data["through_seq"])
            if summary.message is not None and summary.message.data
            else None
        ),
        client_tools=options.client_tools if options is not None and not final else frozenset(),
        summary_ahead=summary.message is None and summary_ahead_wanted(session, assembly),
    )


def model_step(session: Session, owner: str, run: RunContext | None = None) -> None:
    """Ask the model (with fallback), then make the one move its outcome calls for.

    1. Plan the request: the gates that contribute to it (`model_plan`).
    2. The gates that may stop the turn, each a verdict: the budget, the credits. A stop
       ends the turn with what the agent has so far (the `answer` move).
    3. The endpoint's rate limit (a long wait defers the step).
    4. Call the model (a cancel closes the stream); a call that waits on the network
       gives the database connection back first (model_calls.give_back_connection).
    5. One move: the answer (-> the end of the turn), the tool-call intents (-> tool_wait),
       or the cancel; each commits the notes, model calls, usage and cost, the archived
       marks and the new dialogue state with it.
    """
    run = run or RunContext()
    plan = model_plan(session, run)
    request = _request_unless_stopped(session, owner, plan, run)
    if request is None:
        return
    fault_point("before_model_call")
    iteration = session.iteration + 1
    routed = _routed_call(session, owner, plan, run, request, iteration)
    if routed is None:
        return  # cancelled
    spend = ModelSpend(calls=plan.side_calls + routed.calls, iteration=iteration)
    context = plan.context(session, routed.endpoint.name if routed.endpoint else None)
    if routed.response is None:
        _unanswered(
            session, owner, plan.agent, routed.error, spend, context, run.turn_call_counts(session)
        )
        return
    response = routed.response
    if sampled():
        _prompt_sample(session, iteration, routed.calls[-1], request, response)
    tool_calls = [] if plan.final else response.tool_calls
    if request.parallel_tool_calls is False:
        tool_calls = tool_calls[:1]  # a model that ignored it: the client asked for one call
    if not tool_calls:
        _answered(session, owner, plan, run, request, response.text, spend, context)
        return
    tool_intents(
        session,
        owner,
        text=response.text,
        tool_calls=list(tool_calls),
        spend=spend,
        context=context,
        client_tools=plan.client_tools,
    )
    if plan.summary_ahead:
        summary_ahead_enqueue_on_commit(session.pk)


def _request_unless_stopped(
    session: Session, owner: str, plan: ModelPlan, run: RunContext
) -> ChatRequest | None:
    """The request as the gates that may stop the turn leave it (the budget, the credits,
    the endpoint's rate limit, the budget's hold); None when one stopped it (the turn ended
    with what the agent has so far)."""
    history, request = plan.history, plan.request
    stop = (
        budget_stop(plan.gate, history, session.turn).stop
        or credits_stop(
            model_credits_check(
                session,
                plan.gate.endpoint,
                request,
                settings.BUDGET_OUTPUT_ESTIMATE_TOKENS,
                plan.read.figures,
                run.figures.points_since,
            ),
            history,
            session.turn,
        ).stop
    )
    if stop is None:
        model_rate_limit(session, plan.gate.endpoint, request)
        # Last before the call: the other sessions of the owner hold theirs meanwhile.
        gate = budget_hold(session, plan.gate)
        request = gate.request
        stop = budget_stop(gate, history, session.turn).stop
    if stop is None:
        return request
    metrics.BUDGET_REFUSALS.labels(stop.refused).inc()
    answer(
        session,
        owner,
        content=stop.content,
        trigger=stop.trigger,
        stop_reason=stop.stop_reason,
        spend=ModelSpend(calls=plan.side_calls, iteration=session.iteration),
        context=plan.context(session, None),
        reason=stop.reason,
        calls=run.turn_call_counts(session),
    )
    return None


def _routed_call(
    session: Session,
    owner: str,
    plan: ModelPlan,
    run: RunContext,
    request: ChatRequest,
    iteration: int,
) -> Routed | None:
    """The model's answer, from the routed small model or the agent's own (escalated in this
    same step when the small one faltered); None when a cancel closed the stream (the turn
    ended cancelled, keeping what the call used)."""
    agent, tier, way = plan.agent, plan.gate.tier, plan.way
    try:
        routed = call_model(session, agent, request, tier=way.endpoint or tier)
        tiers_record(routed.calls, way.tier, way.reason)
        why = escalation(agent, request, routed.response) if way.tier == SMALL else ""
        if why:
            again = call_model(session, agent, request, tier=tier)
            tiers_record(again.calls, MAIN, f"escalated: {why}")
            again.calls[:0] = routed.calls
            routed = again
        # Taken by this step's commit: the run's kept credit figures count them from now.
        run.figures.spent_points(model_points(plan.summary.calls + routed.calls))
    except RunCancelled as cancelled:
        spent = ModelSpend(
            calls=plan.side_calls + cancelled.calls, iteration=iteration, answered=False
        )
        _cancelled(session, owner, spent)
        return None
    return routed


def _cancelled(session: Session, owner: str, spend: ModelSpend) -> None:
    fresh = hold_carried(Session.objects.get(pk=session.pk), session)
    turn_cancel(session=fresh, owner=owner, spend=spend)


def _prompt_sample(
    session: Session, iteration: int, call: ModelCall, request: ChatRequest, response: ChatResponse
) -> None:
    prompt_sample_record(
        session_id=session.pk,
        owner_id=session.owner_id,
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


def _answered(
    session: Session,
    owner: str,
    plan: ModelPlan,
    run: RunContext,
    request: ChatRequest,
    content: str,
    spend: ModelSpend,
    context: ModelContext,
) -> None:
    """The model answered without tools: the answer move (conformed first when the client
    asked for JSON), then the turn's memory and the summary made ahead."""
    agent = plan.agent
    if plan.final and not content.strip():
        content = LIMIT_ANSWER
    turn = session.turn
    stop_reason: StopReason = plan.stop.stop_reason if plan.stop else StopReason.ANSWER
    problem = ""
    if request.response_format is not None:
        try:
            conformed = answer_conform(session, agent, request, content, tier=plan.gate.tier)
        except RunCancelled as cancelled:
            calls = spend.calls + cancelled.calls
            _cancelled(session, owner, dataclasses.replace(spend, calls=calls, answered=False))
            return
        spend = dataclasses.replace(spend, calls=spend.calls + conformed.calls)
        run.figures.spent_points(model_points(conformed.calls))
        if conformed.failed is not None:
            _unanswered(session, owner, agent, conformed.failed, spend, context)
            return
        content, problem = conformed.text, conformed.problem
        if problem:
            stop_reason = StopReason.INVALID_OUTPUT
    answer(
        session,
        owner,
        content=content,
        trigger=Trigger.LIMIT_REACHED if plan.final else Trigger.ANSWER,
        stop_reason=stop_reason,
        spend=spend,
        context=context,
        last_error=f"invalid_json: {problem}" if problem else "",
        reason=f"{stop_reason}: {problem}" if problem else "",
        calls=run.turn_call_counts(session),
    )
    user_text = "\n".join(m.content for m in plan.history if m.role == "user" and m.turn == turn)
    if wants_turn_memory(agent, user_text):
        memory_enqueue_on_commit(session.pk, turn)
    if plan.summary_ahead:
        summary_ahead_enqueue_on_commit(session.pk)


def _unanswered(
    session: Session,
    owner: str,
    agent: Agent,
    error: ModelError | None,
    spend: ModelSpend,
    context: ModelContext,
    calls: CallCounts | None = None,
) -> None:
    """No model could answer: the turn ends with the agent's busy message."""
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
        calls=calls,
    )


@dataclass(frozen=True)
class Conformed:
    text: str  # the answer to store: valid JSON text, or the last try when still invalid
    problem: str  # what is still wrong with it ("" when valid)
    calls: list[ModelCall]  # the repair's model calls
    failed: ModelError | None = None  # the repair found no model to answer


def answer_conform(
    session: Session, agent: Agent, request: ChatRequest, text: str, *, tier: ModelEndpoint | None
) -> Conformed:
    """An answer the client asked to be JSON (`request.response_format`): checked, and when
    it is not valid, repaired once in this same step (the answer and what is wrong with it,
    then "again", without tools), as a workflow's llm node does (engine/model/structured.py).

    The first try was streamed to the session's clients: they are told it is discarded
    (`answer_discarded`) before the repair streams. The OpenAI-compatible endpoint sends
    such an answer whole, from the stored message, so its clients never see the first try.
    """
    assert request.response_format is not None
    checked = answer_check(text, request.response_format)
    if not checked.problem:
        return Conformed(checked.text, "", [])
    discarded: Progress = {"stage": "answer_discarded", "turn": session.turn}
    publish_ephemeral(session.pk, EventType.PROGRESS, discarded)
    repair = dataclasses.replace(
        request,
        messages=(*request.messages, *repair_messages(text, checked.problem)),
        tools=(),
        tool_choice="none",
    )
    routed = call_model(session, agent, repair, tier=tier)
    if routed.response is None:
        return Conformed(text, checked.problem, routed.calls, failed=routed.error)
    again = answer_check(routed.response.text, request.response_format)
    if again.problem:
        return Conformed(routed.response.text, again.problem, routed.calls)
    return Conformed(again.text, "", routed.calls)
