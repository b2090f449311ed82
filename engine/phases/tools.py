"""The tool phase of a step: run the calls whose intent is committed, exactly once.

Side-effecting calls are marked dispatched (committed) just before they are
sent. A call found still executing and dispatched after a crash is uncertain:
the tool's probe is asked with the idempotency key; if it took effect its
result is used; if it cannot tell, it is asked again later (bounded); if not
(or the probe still cannot tell and the tool is idempotent) it is sent again
with the same key; for a tool that is not idempotent a person is asked instead
of guessing (a recovery review in the approvals queue).

Calls that may be stale (after a crash recovery, a long pause, or an uncertain call
about to be sent again) are not sent on a picture that moved: past the drift
threshold a side-effecting call goes back to the model, and a call whose business
precheck fails goes to a person (engine/gates/environment.py, revalidation.py).
"""

import logging
from dataclasses import dataclass, field

from django.db import connection
from django.utils import timezone

from engine.gates import Verdict
from engine.gates.approval import approval_gate
from engine.gates.budget import FiguresKeeper, StepDeferred
from engine.gates.children import Children, ChildrenWait, children_gate
from engine.gates.client_tools import client_wait
from engine.gates.credit_pool import PoolAnswer, pool_gate
from engine.gates.environment import drift_hold
from engine.gates.handoff import HandoffTo, handoff_gate
from engine.gates.metering import credits_reserve, tool_credits_stop
from engine.gates.questions import Question, questions_of
from engine.gates.recovery import Recovered, recovery_probe
from engine.gates.replay import ReplaySource, replay_gate, replay_source
from engine.gates.revalidation import Rechecked, pending_prechecks, review_outcomes
from engine.gates.risk import CHECKPOINT_LEVEL, calls_assess
from engine.gates.tool_limits import tool_gates
from engine.model.environment import Environment
from engine.moves.approval import approvals_wait, recovery_reviews_open
from engine.moves.checkpoint import (
    calls_dispatched,
    calls_probed,
    calls_retry_later,
    pre_run_checkpoint,
)
from engine.moves.children import children_start, children_started
from engine.moves.credits import credits_park, pool_wake
from engine.moves.turn import TIMER_HANDLER, tool_results
from engine.phases.memory_tools import is_memory_call, memory_tool_outcomes
from engine.run_cache import WorkflowRuntime, agent_runtime, workflow_runtime
from engine.store.open_calls import cached_output_read, open_calls
from observability import metrics, tracing
from observability.redaction import digest
from observability.turns import tool_calls_count
from record.models import Agent, Session, ToolCall, ToolCallStatus
from record.rows import json_value
from runtime import io_loop
from runtime.faults import fault_point
from tools.builtin import ASK_USER_HANDLER, MEMORY_HANDLERS, WORKFLOW_REVIEW_HANDLER
from tools.execution import (
    ToolInvocation,
    ToolOutcome,
    ToolSnapshot,
    execute_all,
)
from tools.rendering import render_success

logger = logging.getLogger(__name__)


def _cached_outcomes(
    session: Session, calls: list[ToolCall], tools: dict[str, ToolSnapshot]
) -> dict[int, ToolOutcome]:
    """Read-only calls identical to an earlier successful one in this session reuse its result.

    The earlier result comes with the call itself (`cached_output`, read by
    `open_calls`); arguments are compared as jsonb (canonical: key order and
    spacing do not matter).
    """
    readonly = [
        c
        for c in calls
        if (t := tools.get(c.tool_name)) is not None
        and not t.side_effects
        and isinstance(c.input, dict)
        and not c.error
    ]
    outcomes: dict[int, ToolOutcome] = {}
    for call in readonly:
        found = json_value(getattr(call, "cached_output", None))
        if found is not None:
            outcomes[call.pk] = ToolOutcome(
                status=ToolCallStatus.SUCCESS,
                output=found,
                content=render_success(found, cached=True),
                extra={"cached": True},
            )
    return outcomes


@dataclass
class _Settled:
    """What the tool step's gates settled before anything runs: each settled call's outcome
    (it does not run), and what the results' commit carries besides."""

    outcomes: dict[int, ToolOutcome]
    kids: Verdict[Children]
    handoffs: Verdict[HandoffTo]
    rechecked: Rechecked | None = None
    question: Question | None = None
    credits: Verdict[None] = field(default_factory=Verdict)
    pool: PoolAnswer | None = None


def tool_step(session: Session, owner: str, keep: FiguresKeeper | None = None) -> None:
    """Run the pending tool calls of this turn and commit their results.

    1. Load the calls whose intent was committed, and the tools the role may use.
    2. The gates, in order; each settles some calls (their outcomes: they do not run)
       or makes the step wait (the move that pauses it, then return): approvals (wait
       for a person, or a refusal), cached results of identical read-only calls,
       recovery reviews and probes of calls dispatched before a crash (a probe that
       cannot tell defers the step), the drift and the business prechecks of calls
       that may be stale (a failed check waits for a person), degradation
       and per-tool rate limits, `ask_user` questions (left open), memory tools (run
       here), credits (reserved, or refused).
    3. Before sending: the pre-run recovery checkpoint and the dispatched marks
       (engine/moves/checkpoint.py).
    4. Run the rest concurrently under the agent's step time limit, without
       holding a database connection.
    5. One move: results, tool messages and events in one commit (`tool_results`);
       a scheduled follow-up waits for its timer, calls the client runs (its own tools,
       never sent here: engine/gates/client_tools.py) wait for its results.
    """
    runtime = agent_runtime(session.agent_id, session)
    calls = open_calls(session)
    _retry_due(calls)  # StepDeferred: a parked retry's wait is not over
    # The client's own tools' calls are its to run: they never reach a gate or the executor.
    client = client_wait(calls).intent
    calls = [c for c in calls if not c.client]
    tools = runtime.tools_for(session.role)
    workflow = workflow_runtime(session)
    if workflow is not None:
        tools = workflow.tools_with(tools)
    env = runtime.environment(session.role)
    source = replay_source(session)
    if source is not None:
        replay_step(session, owner, source, calls, tools, env, runtime.agent.step_timeout_s)
        return
    if not calls and client is not None:
        tool_results(session, owner, calls=[], outcomes={}, tools=tools, env=env, client=client)
        return
    settled = _settled_early(session, owner, calls, tools, runtime.agent)
    if settled is None or not _settled_unless_stale(
        session, owner, calls, tools, env, runtime.agent, settled
    ):
        return  # the step waits (a person, another agent)
    to_run = _settled_last(session, owner, calls, tools, settled, keep)
    if to_run is None:
        return  # parked for the credit pool's points; a release wakes the run
    _run(session, owner, calls, to_run, tools, workflow, runtime.agent, settled.outcomes)
    for call in calls:
        # Settled or released by the results' commit (a call never reserved is left alone).
        if (tool := tools.get(call.tool_name)) is not None and tool.credit_cost > 0:
            call.credit_points = tool.credit_cost  # type: ignore[attr-defined]
    stop = tool_credits_stop(session, settled.credits, calls[0].step).stop
    kids = settled.kids.intent or Children()
    asked = {settled.question.call.pk} if settled.question else set()
    pool = settled.pool
    # The pool's points this step holds: released by the results' commit.
    session.pool_held = bool(pool and pool.granted)  # type: ignore[attr-defined]
    tool_results(
        session,
        owner,
        calls=[c for c in calls if c.pk not in asked],
        outcomes=settled.outcomes,
        tools=tools,
        env=env,
        extra_events=[*settled.credits.events, *kids.announcements, *settled.kids.events],
        usage=kids.usage,
        handoff=settled.handoffs.intent,
        stop=stop.stop_reason if stop else None,
        stop_note=stop.content if stop else "",
        ask=settled.question,
        client=client,
        revalidated=settled.rechecked.checked if settled.rechecked else False,
    )
    if pool is not None and pool.granted:
        pool_wake(pool_id=pool.pool_id)  # its points are back: the queue's next ones go


def _settled_early(
    session: Session,
    owner: str,
    calls: list[ToolCall],
    tools: dict[str, ToolSnapshot],
    agent: Agent,
) -> _Settled | None:
    """Approvals, other agents' calls, handoffs and cached results; None when the step
    waits (for a person, or raises ChildrenWait for its children)."""
    calls_assess(calls, tools)  # the risk levels the approval gate and the checkpoint read
    gate = approval_gate(session, calls, tools)
    if gate.wait:
        approvals_wait(session, owner, gate.intent or [])
        return None
    settled = dict(gate.settled)
    # Calls another agent answers: their children run first; this step waits without a worker.
    kids = children_gate(session, [c for c in calls if c.pk not in settled], agent.max_depth)
    if kids.wait and kids.intent is not None:
        started = kids.intent.unannounced + children_start(session, kids.intent.to_start)
        if started:
            children_started(session, owner, started)
        raise ChildrenWait
    settled.update(kids.settled)
    # A transfer_to_<slug> call: settled here; the results' commit switches the agent.
    handoffs = handoff_gate(
        session, [c for c in calls if c.pk not in settled], list(agent.handoffs)
    )
    settled.update(handoffs.settled)
    # A recall must see memory as it is now, not an earlier identical call's answer.
    outcomes = _cached_outcomes(
        session,
        [c for c in calls if c.pk not in settled and not is_memory_call(c, tools)],
        tools,
    )
    outcomes.update(settled)
    return _Settled(outcomes=outcomes, kids=kids, handoffs=handoffs)


def _settled_unless_stale(
    session: Session,
    owner: str,
    calls: list[ToolCall],
    tools: dict[str, ToolSnapshot],
    env: Environment,
    agent: Agent,
    settled: _Settled,
) -> bool:
    """Reviews of and probes for calls dispatched before a crash, then the drift and the
    business prechecks of calls that may be stale; False when the step waits for a person."""
    outcomes = settled.outcomes
    reviewed = review_outcomes([c for c in calls if c.pk not in outcomes])
    if reviewed.wait:
        return False  # a person is still looking at it; their answer wakes the run
    outcomes.update(reviewed.settled)
    resend = reviewed.intent or set()
    probed = recovery_probe(
        [c for c in calls if c.pk not in outcomes and c.pk not in resend], tools
    )
    recovered = probed.intent or Recovered()
    calls_probed(recovered.probed)
    if probed.wait:
        # A probe could not tell yet: ask again later; the wait lives in the lease's
        # expiry (the sweeper's), no worker holds it.
        raise StepDeferred(probed.wait.after_s or 0.0)
    outcomes.update(probed.settled)
    # What a person already decided to send is sent; the rest may be stale after a
    # crash recovery or a long pause: the drift, then the business prechecks.
    reviewing = {c.pk for c, _ in recovered.to_review}
    unsettled = [
        c for c in calls if c.pk not in outcomes and c.pk not in resend and c.pk not in reviewing
    ]
    held = drift_hold(session, agent, unsettled, tools, env).settled
    outcomes.update(held)
    prechecks = pending_prechecks(session, [c for c in unsettled if c.pk not in outcomes], tools)
    outcomes.update(prechecks.settled)
    rechecked = prechecks.intent or Rechecked()
    settled.rechecked = rechecked
    to_review = recovered.to_review + rechecked.to_review
    if to_review:
        # The calls held for the drift are only settled by the results' commit: until
        # then the recovery's resume_check must keep holding them.
        spent = rechecked.checked and not held
        recovery_reviews_open(session, owner, to_review, tools, revalidated=spent)
        return False
    return True


def _settled_last(
    session: Session,
    owner: str,
    calls: list[ToolCall],
    tools: dict[str, ToolSnapshot],
    settled: _Settled,
    keep: FiguresKeeper | None,
) -> list[ToolCall] | None:
    """Degradation and rate limits, questions to the user (left open), memory tools (run
    here), the credit pool (granted, refused, or None: the run is parked until points come
    back) and credits (reserved, or refused); the calls left to send."""
    outcomes = settled.outcomes
    outcomes.update(tool_gates(session, [c for c in calls if c.pk not in outcomes], tools).settled)
    # A question to the user stays open: their next message is its result.
    settled.question = questions_of([c for c in calls if c.pk not in outcomes], tools).intent
    asked = {settled.question.call.pk} if settled.question else set()
    # remember/recall need the session's owner and id: run here, recorded like any tool.
    outcomes.update(
        memory_tool_outcomes(
            session, [c for c in calls if c.pk not in outcomes and c.pk not in asked], tools
        )
    )
    to_run = [c for c in calls if c.pk not in outcomes and c.pk not in asked]
    pool = pool_gate(session, to_run, tools)
    answer = pool.intent or PoolAnswer()
    if pool.wait:
        # No room in the credit pool: park (no worker held); a release wakes the run.
        credits_park(session, owner, answer)
        pool_wake(pool_id=answer.pool_id)
        return None
    settled.pool = answer
    outcomes.update(pool.settled)
    to_run = [c for c in to_run if c.pk not in pool.settled]
    credits = credits_reserve(session, to_run, tools)  # CreditsWait: the run steps aside
    if credits.settled:
        metrics.BUDGET_REFUSALS.labels("tool_credits").inc(len(credits.settled))
    outcomes.update(credits.settled)
    settled.credits = credits
    to_run = [c for c in to_run if c.pk not in credits.settled]
    reserved = sum(getattr(c, "credit_points", 0) for c in to_run)
    if reserved:
        if keep is not None:
            keep.spent_points(reserved)  # the run's kept credit figures count them from now
        fault_point("after_credits_reserved")
    return to_run


def _run(
    session: Session,
    owner: str,
    calls: list[ToolCall],
    to_run: list[ToolCall],
    tools: dict[str, ToolSnapshot],
    workflow: WorkflowRuntime | None,
    agent: Agent,
    outcomes: dict[int, ToolOutcome],
) -> None:
    """Checkpoint and mark what is sent, send it without a connection held, and add its
    outcomes (StepDeferred: retries parked for a while)."""
    pre_run_checkpoint(session, owner, to_run, tools)
    # Fresh calls and uncertain ones sent again after their probe alike.
    calls_dispatched(
        session,
        owner,
        [c for c in to_run if c.tool_name in tools and tools[c.tool_name].side_effects],
    )
    connection.close()
    invocations = [_invocation(c, workflow) for c in to_run]
    started_ns = tracing.now_ns()
    ran = io_loop.run(
        execute_all(invocations, tools, session.role, step_timeout_s=agent.step_timeout_s)
    )
    _observe_tools(session, to_run, ran, started_ns)
    later = [(c, o) for c, o in zip(to_run, ran, strict=True) if "retry_in_s" in o.extra]
    if later:
        parked = _park_retries(session, owner, calls, later, to_run, tools)
        if parked is not None:
            raise StepDeferred(parked)
    outcomes.update({c.pk: o for c, o in zip(to_run, ran, strict=True)})
    fault_point("before_tool_results_commit")


def replay_step(
    session: Session,
    owner: str,
    source: ReplaySource,
    calls: list[ToolCall],
    tools: dict[str, ToolSnapshot],
    env: Environment,
    step_timeout_s: float | None,
) -> None:
    """An evaluation's replay of a recorded turn: the calls are answered from the record
    (engine/gates/replay.py), the read-only calls it lacks run only if the evaluation allows
    it, a side effect is never sent; no approval, question, credit or child waits."""
    verdict = replay_gate(session, source, calls, tools)
    outcomes = dict(verdict.settled)
    to_run = verdict.intent or []
    if to_run:
        connection.close()
        ran = io_loop.run(
            execute_all(
                [_invocation(c, None) for c in to_run],
                tools,
                session.role,
                step_timeout_s=step_timeout_s,
            )
        )
        outcomes.update({c.pk: o for c, o in zip(to_run, ran, strict=True)})
    tool_results(session, owner, calls=calls, outcomes=outcomes, tools=tools, env=env)


def _retry_due(calls: list[ToolCall]) -> None:
    """A run woken before a parked retry's time (a new message, the sweeper) parks again."""
    now = timezone.now()
    due = max((c.retry_at for c in calls if c.retry_at is not None), default=None)
    if due is not None and due > now:
        raise StepDeferred((due - now).total_seconds())


def _park_retries(
    session: Session,
    owner: str,
    calls: list[ToolCall],
    later: list[tuple[ToolCall, ToolOutcome]],
    to_run: list[ToolCall],
    tools: dict[str, ToolSnapshot],
) -> float | None:
    """Park the session for the calls whose retry waits too long for a worker; the wait, or
    None when they cannot be parked (then their failure goes to the model, with the wait).

    Parking drops this step's other outcomes: the step runs again after the wait. So it
    parks only when running the others again is harmless: no call of the batch with side
    effects ran, nothing wrote memory, reserved credits or started another agent. The
    calls' attempts and due time are committed first (`calls_retry_later`).
    """
    waiting = {c.pk for c, _ in later}
    harmful = [c for c in calls if c.pk not in waiting and not _rerun_harmless(c, to_run, tools)]
    if harmful or any(getattr(c, "credit_points", 0) for c in to_run):
        for _, outcome in later:
            wait = float(outcome.extra["retry_in_s"])
            outcome.content += f" It may work if called again in {wait:.0f} s."
        return None
    wait = max(float(o.extra["retry_in_s"]) for _, o in later)
    calls_retry_later(
        session, owner, [(c, o.attempts, float(o.extra["retry_in_s"])) for c, o in later]
    )
    logger.info(
        "tool retries parked: session=%s calls=%s wait_s=%.1f",
        session.pk,
        ",".join(c.call_id for c, _ in later),
        wait,
    )
    return wait


def _rerun_harmless(call: ToolCall, to_run: list[ToolCall], tools: dict[str, ToolSnapshot]) -> bool:
    """May this call's settling be done again when the step runs again? Not if it ran with
    side effects, wrote memory, costs credits or is not the executor's (another agent, a
    handoff): a gate's refusal or a read-only result is simply found again."""
    tool = tools.get(call.tool_name)
    if tool is None or tool.kind not in _EXECUTED or tool.paid:
        return False
    if is_memory_call(call, tools):
        return False
    return not (tool.side_effects and call in to_run)


def _invocation(call: ToolCall, workflow: WorkflowRuntime | None) -> ToolInvocation:
    return ToolInvocation(
        call_id=call.call_id,
        name=call.tool_name,
        arguments=call.input if isinstance(call.input, dict) else {},
        idempotency_key=call.idempotency_key,
        arguments_error=call.error
        or (None if isinstance(call.input, dict) else "arguments must be a JSON object"),
        # A workflow node's own time limit (its timeout_s) instead of the tool's.
        timeout_s=workflow.timeout_of(call.call_id) if workflow is not None else None,
        attempts_before=call.attempts,
    )


# Tools the tool step treats apart (a timer, a question to the user, memory, a person's
# review): their calls always take the ordinary way.
_APART = frozenset({TIMER_HANDLER, ASK_USER_HANDLER, WORKFLOW_REVIEW_HANDLER, *MEMORY_HANDLERS})
# The kinds the executor itself runs (tools/execution.py `_invoke`).
_EXECUTED = frozenset({"python", "http", "mcp"})


def runs_in_step(tool: ToolSnapshot | None) -> bool:
    """May a call of this tool run in the step that decides it (a workflow's tool node, in its
    node step), its result committed with that step's other writes: one commit, not an
    intent's and then a result's?

    Only a read-only tool the executor runs (python, http, mcp: not another agent's loop
    nor a handoff) that no person has to approve, that costs no credit points, whose
    declared risk needs no pre-run checkpoint and that the tool step does not treat
    apart: nothing of what the ordinary way commits before a call is sent applies to it.
    """
    return (
        tool is not None
        and tool.kind in _EXECUTED  # not another agent's loop, a handoff, ...
        and not tool.side_effects
        and not tool.requires_approval
        and not tool.approval_when
        and not tool.paid
        and (tool.risk_level or 0) < CHECKPOINT_LEVEL
        and tool.handler not in _APART
    )


def tool_run_in_step(
    session: Session,
    call: ToolCall,
    tools: dict[str, ToolSnapshot],
    *,
    workflow: WorkflowRuntime | None,
    step_timeout_s: float | None,
) -> ToolOutcome | None:
    """Run one read-only call now, in the step that decided it, with the tool step's gates in
    the tool step's order (the same functions); None when it has to take the ordinary way
    instead (its intent committed, then a tool step), which decides it again.

    1. `runs_in_step`; memory tools and questions to the user take the ordinary way.
    2. The approval gate (a risk level or condition that asks for a person, or a level
       that needs the pre-run checkpoint: the ordinary way).
    3. The read-only cache: the latest identical successful call in the session answers.
    4. Degradation and the tool's rate limit; credits (a free tool reserves nothing).
    5. The executor (role, validation, coercions, the time limits, the breaker, the
       result's size limit), without a database connection held; then the tool's
       metrics, log line and span.

    The call is not stored yet: nothing was dispatched, so nothing is probed or reviewed
    after a crash. A crash before the step's commit loses the result and the call runs
    again, as a read-only call does whose results' commit was lost.
    """
    if (
        not runs_in_step(tools.get(call.tool_name))
        # An evaluation's replay answers every call from the record (replay_step).
        or replay_source(session) is not None
        or is_memory_call(call, tools)
        or questions_of([call], tools).wait
    ):
        return None
    call.has_approval = False  # type: ignore[attr-defined] # not stored: never asked about
    calls_assess([call], tools)
    gate = approval_gate(session, [call], tools)
    if gate.wait or gate.settled or (call.risk_level or 0) >= CHECKPOINT_LEVEL:
        return None
    if isinstance(call.input, dict) and not call.error:
        call.cached_output = cached_output_read(session, call.tool_name, call.input)  # type: ignore[attr-defined]
    # The gates key their outcomes by the call's id: this one has none yet (None).
    settled = _cached_outcomes(session, [call], tools)
    settled = settled or dict(tool_gates(session, [call], tools).settled)
    settled = settled or dict(credits_reserve(session, [call], tools).settled)
    if settled:
        return settled[call.pk]
    connection.close()
    started_ns = tracing.now_ns()
    ran = io_loop.run(
        execute_all(
            [_invocation(call, workflow)], tools, session.role, step_timeout_s=step_timeout_s
        )
    )
    _observe_tools(session, [call], ran, started_ns)
    return ran[0]


def _observe_tools(
    session: Session, calls: list[ToolCall], outcomes: list[ToolOutcome], started_ns: int
) -> None:
    """Per call: a span (name, call id, status, duration) and a log line; no contents. (The
    tool-call counter counts every call's end, these and the refused, at its commit.)"""
    for call, outcome in zip(calls, outcomes, strict=True):
        # Arguments and results may hold personal data: their size and hash only.
        logger.info(
            "tool call ran: tool=%s call=%s status=%s elapsed_ms=%s arguments=%s result=%s",
            call.tool_name,
            call.call_id,
            outcome.status,
            outcome.elapsed_ms,
            digest(call.input),
            digest(outcome.output),
        )
    tool_calls_count(session.pk, len(calls))
    tracing.tool_spans(
        [
            (c.tool_name, c.call_id, o.status, o.elapsed_ms)
            for c, o in zip(calls, outcomes, strict=True)
        ],
        started_ns,
    )
