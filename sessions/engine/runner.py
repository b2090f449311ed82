"""The run loop: take the lease, run steps until nothing is left, give the lease back.

Each step is one of: start the next queued turn, call the model, run the tool
calls it asked for, or move from tool results back to the model. Each ends in
exactly one `step_commit`. No database connection is held across a model or
tool call, and no transaction is open during one.
"""

import logging
from dataclasses import dataclass
from decimal import Decimal
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db import connection
from django.utils import timezone

from memory.tokens import count_message_tokens
from tools.execution import ToolInvocation, ToolOutcome, execute_all, tools_for_agent
from tools.rendering import render_success

from .. import io_loop
from ..models import Agent, Message, MessageStatus, Session, ToolCall, ToolCallStatus
from ..states import RUNNABLE, TURN_ENDED, State, Trigger
from ..transitions import StaleSession, Step, step_commit
from . import guards
from .context import LIMIT_NOTE, build_request, stable_json, tool_calls_json
from .guards import CallRecord, GuardLimits, GuardVerdict
from .lease import heartbeat, lease_acquire, lease_drop, lease_release, worker_identity
from .routing import call_model

logger = logging.getLogger(__name__)

LIMIT_ANSWER = "I stopped after the maximum number of tool rounds for one request."
BUSY_ANSWER = "The service is busy right now. Please try again in a moment."


@dataclass(frozen=True)
class RunResult:
    steps: int
    stopped: str  # idle | not_acquired | lease_lost | crashed


def session_run(*, session_id: UUID | str, owner: str | None = None) -> RunResult:
    """Run a session's pending work to the end, holding its lease throughout.

    1. Take the lease (or return at once if another worker holds it).
    2. Repeat: reload the session, run one step.
    3. When nothing is runnable, release the lease; the release fails if
       work arrived meanwhile, and the loop goes on.
    """
    owner = owner or worker_identity()
    lease_s = settings.SESSION_LEASE_S
    if not lease_acquire(session_id=session_id, owner=owner, seconds=lease_s):
        connection.close()
        return RunResult(0, "not_acquired")
    heartbeat.hold(session_id, owner)
    steps = 0
    try:
        while True:
            session = Session.objects.select_related("agent").filter(pk=session_id).first()
            if session is None or session.lease_owner != owner:
                return RunResult(steps, "lease_lost")
            try:
                progressed = run_step(session, owner)
            except StaleSession:
                logger.info("session %s moved under us; reloading", session_id)
                continue
            except Exception:
                logger.exception("step of session %s crashed", session_id)
                _record_crash(session_id, owner)
                return RunResult(steps, "crashed")
            if progressed:
                steps += 1
            elif lease_release(session_id=session_id, owner=owner):
                return RunResult(steps, "idle")
    finally:
        heartbeat.release(session_id)
        connection.close()


def run_step(session: Session, owner: str) -> bool:
    """Run the one step the session's state calls for; False if there is none."""
    state = State(session.state)
    if session.cancel_requested and state in RUNNABLE:
        _finish_turn(session, owner, Trigger.CANCEL, "cancel requested", stop_reason="cancelled")
        return True
    if state in TURN_ENDED:
        if session.queued_count > 0:
            return turn_start(session=session, lease_owner=owner)
        return False
    if state == State.PROCESSING:
        model_step(session, owner)
    elif state == State.TOOL_WAIT:
        tool_step(session, owner)
    elif state == State.TOOL_LOOP:
        step_commit(_step(session, owner, trigger=Trigger.MODEL_CALL, phase="model"))
    else:
        return False
    return True


def _step(session: Session, owner: str | None, *, trigger: Trigger | None, phase: str, **kwargs: Any) -> Step:
    """A Step with the lease guard, lease renewal and a delta checkpoint."""
    checkpoint = {
        "turn": kwargs.get("set_fields", {}).get("turn", session.turn),
        "iteration": kwargs.get("set_fields", {}).get("iteration", session.iteration),
        "phase": phase,
        **kwargs.pop("checkpoint", {}),
    }
    return Step(
        session=session,
        trigger=trigger,
        lease_owner=owner,
        lease_seconds=settings.SESSION_LEASE_S if owner else settings.SESSION_PICKUP_GRACE_S,
        checkpoint=checkpoint,
        **kwargs,
    )


def turn_start(*, session: Session, lease_owner: str | None) -> bool:
    """Move the oldest queued user message into the history and start its turn."""
    message = (
        Message.objects.filter(session=session, status=MessageStatus.QUEUED).order_by("id").first()
    )
    if message is None:
        return False
    turn = session.turn + 1
    step_commit(
        _step(
            session,
            lease_owner,
            trigger=Trigger.USER_MESSAGE,
            phase="turn_start",
            reason=f"turn {turn}",
            activate_message=message,
            set_fields={
                "turn": turn, "iteration": 0, "cancel_requested": False, "last_error": "", "turn_started_at": timezone.now(),
            },
            add_fields={"queued_count": -1},
            checkpoint={"user_message": message.pk},
        )
    )
    return True


def model_step(session: Session, owner: str) -> None:
    """Ask the model (with fallback), then commit its answer or its tool calls (with their intent rows).

    1. Read the agent, its endpoints and tools fresh: edits in the admin or by
       apply_config take effect at the next step, without a restart.
    2. Give the database connection back, then call the model.
    3. Commit: the assistant message, the ModelCall rows, usage and cost, and
       either the tool-call intents (-> tool_wait) or the end of the turn.
    """
    agent: Agent = Agent.objects.select_related("model", "fallback_model", "candidate_model").get(pk=session.agent_id)
    stop = loop_stop(session, agent)
    final = stop is not None
    tools = {} if final else tools_for_agent(list(agent.tools), session.role)
    history = list(Message.objects.filter(session=session, status=MessageStatus.FINAL).order_by("seq"))
    request = build_request(agent=agent, history=history, tools=tools, final=final, note=stop.note if stop else "")
    connection.close()  # never hold a connection across the model call

    routed = call_model(session, agent, request)
    usage: dict[str, Any] = {
        "add_fields": {"input_tokens": routed.input_tokens, "output_tokens": routed.output_tokens, "cost": routed.cost},
        "model_calls": routed.calls,
        "set_fields": {"iteration": session.iteration + 1},
    }
    used = routed.endpoint.name if routed.endpoint else None
    if routed.response is None:
        error = routed.error
        problem = str(error) if error else "model call failed"
        if error is not None and not error.retryable:
            # A configuration error: no retry, and the operator must see it.
            _finish_turn(session, owner, Trigger.FAILURE, problem, stop_reason="error", error=problem, extra=usage)
            return
        _answer(session, owner, agent.busy_message or BUSY_ANSWER, Trigger.ANSWER, "model_unavailable", usage, used, last_error=problem)
        return

    response = routed.response
    tool_calls = [] if final else response.tool_calls
    if not tool_calls:
        content = response.text
        if final and not content.strip():
            content = LIMIT_ANSWER
        trigger = Trigger.LIMIT_REACHED if final else Trigger.ANSWER
        _answer(session, owner, content, trigger, stop.stop_reason if stop else "answer", usage, used)
        return

    step_no = session.step + 1
    calls = [
        ToolCall(
            turn=session.turn,
            step=step_no,
            position=position,
            call_id=call.id,
            tool_name=call.name,
            input=call.arguments,
            error=call.arguments_error or "",
            idempotency_key=f"{session.pk}:{session.turn}:{step_no}:{position}:{call.name}",
        )
        for position, call in enumerate(tool_calls)
    ]
    message = Message(
        turn=session.turn,
        role="assistant",
        content=response.text,
        tool_calls=tool_calls_json(tool_calls),
        token_count=count_message_tokens(response.text, stable_json(tool_calls_json(tool_calls))),
    )
    step_commit(
        _step(
            session, owner, trigger=Trigger.TOOL_CALLS, phase="tool_intent",
            reason=", ".join(c.tool_name for c in calls),
            messages=[message],
            new_tool_calls=calls,
            after_events=[
                ("tool.started", {"call_id": c.call_id, "tool": c.tool_name, "input": c.input, "turn": c.turn})
                for c in calls
            ],
            checkpoint={"model": used, "pending": [[c.call_id, c.idempotency_key] for c in calls]},
            **usage,
        )
    )


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
            return GuardVerdict("turn_timeout", f"This request has run for {int(elapsed)} s, past its limit of {agent.turn_timeout_s:g} s.")
    if session.iteration < 2:
        return None
    rows = ToolCall.objects.filter(session=session, turn=session.turn).order_by("step", "position")
    steps: dict[int, list[CallRecord]] = {}
    for row in rows.only("step", "tool_name", "input", "output", "status"):
        steps.setdefault(row.step, []).append(CallRecord(row.tool_name, row.input, row.output, row.status))
    limits = GuardLimits(repeat_limit=agent.repeat_call_limit, same_result_limit=agent.same_result_limit)
    return guards.check(list(steps.values()), limits)


def _answer(
    session: Session, owner: str, content: str, trigger: Trigger, stop_reason: str, usage: dict[str, Any],
    model: str | None, last_error: str = "",
) -> None:
    message = Message(turn=session.turn, role="assistant", content=content, token_count=count_message_tokens(content))
    add = usage["add_fields"]
    summary = _turn_summary(
        session, stop_reason, add["input_tokens"], add["output_tokens"], add["cost"],
        iterations=usage["set_fields"]["iteration"],
    )
    try:
        step_commit(
            _step(
                session, owner, trigger=trigger, phase="answer", reason=stop_reason,
                messages=[message],
                after_events=[("turn.finished", summary)],
                checkpoint={"model": model},
                add_fields=add,
                model_calls=usage["model_calls"],
                set_fields={**usage["set_fields"], "last_error": last_error[:2000]},
                unless_cancel_requested=True,
            )
        )
    except StaleSession:
        # An interrupt arrived while the model answered: the turn ends cancelled
        # (the call's usage is kept); any other conflict goes to the run loop.
        fresh = Session.objects.filter(pk=session.pk, lease_owner=owner, cancel_requested=True).first()
        if fresh is None or State(fresh.state) not in RUNNABLE:
            raise
        _finish_turn(fresh, owner, Trigger.CANCEL, "cancel requested", stop_reason="cancelled", extra=usage)


def tool_step(session: Session, owner: str) -> None:
    """Run the pending tool calls of this turn and commit their results.

    1. Load the calls whose intent was committed, and the tools the role may use.
    2. Answer read-only calls identical to an earlier successful one in this
       session from that result (marked cached), without running them again.
    3. Run the rest concurrently under the agent's step time limit; the
       connection is given back first.
    4. Commit results, tool messages and events in one step.
    """
    agent: Agent = Agent.objects.get(pk=session.agent_id)
    calls = list(
        ToolCall.objects.filter(session=session, turn=session.turn, status=ToolCallStatus.EXECUTING).order_by(
            "step", "position"
        )
    )
    tools = tools_for_agent(list(agent.tools), session.role)
    outcomes: dict[int, ToolOutcome] = {}
    for call in calls:
        snapshot = tools.get(call.tool_name)
        if snapshot is None or snapshot.side_effects or not isinstance(call.input, dict) or call.error:
            continue
        earlier = (
            ToolCall.objects.filter(session=session, tool_name=call.tool_name, status=ToolCallStatus.SUCCESS, input=call.input)
            .exclude(pk=call.pk)
            .order_by("-id")
            .values_list("output", flat=True)
            .first()
        )
        if earlier is not None:
            outcomes[call.pk] = ToolOutcome(status="success", output=earlier, content=render_success(earlier, cached=True), extra={"cached": True})
    connection.close()

    to_run = [c for c in calls if c.pk not in outcomes]
    invocations = [
        ToolInvocation(
            call_id=c.call_id,
            name=c.tool_name,
            arguments=c.input if isinstance(c.input, dict) else {},
            idempotency_key=c.idempotency_key,
            arguments_error=c.error or (None if isinstance(c.input, dict) else "arguments must be a JSON object"),
        )
        for c in to_run
    ]
    ran = io_loop.run(execute_all(invocations, tools, session.role, step_timeout_s=agent.step_timeout_s))
    outcomes.update({c.pk: o for c, o in zip(to_run, ran, strict=True)})

    finished_at = timezone.now()
    messages: list[Message] = []
    events: list[tuple[str, dict[str, Any]]] = []
    for call in calls:
        outcome = outcomes[call.pk]
        call.status = outcome.status
        call.output = outcome.output
        call.error = outcome.error
        call.elapsed_ms = outcome.elapsed_ms
        call.finished_at = finished_at
        call.coercions = outcome.coercions
        call.attempts = outcome.attempts
        call.cached = bool(outcome.extra.get("cached"))
        messages.append(
            Message(
                turn=session.turn,
                role="tool",
                content=outcome.content,
                tool_call_id=call.call_id,
                name=call.tool_name,
                data=outcome.output if outcome.output is not None else {"error": outcome.error, "status": outcome.status},
                token_count=count_message_tokens(outcome.content),
            )
        )
        events.append(
            (
                "tool.finished",
                {
                    "call_id": call.call_id,
                    "tool": call.tool_name,
                    "status": outcome.status,
                    "elapsed_ms": outcome.elapsed_ms,
                    "output": outcome.output,
                    "error": outcome.error,
                    "cached": call.cached,
                    "coercions": call.coercions,
                    "turn": call.turn,
                },
            )
        )
    step_commit(
        _step(
            session, owner, trigger=Trigger.TOOL_RESULTS, phase="tool_results",
            reason=", ".join(f"{c.tool_name}={c.status}" for c in calls),
            messages=messages,
            updated_tool_calls=calls,
            events=events,
            checkpoint={"done": [[c.call_id, c.status] for c in calls]},
        )
    )


def _turn_summary(
    session: Session, stop_reason: str, input_tokens: int = 0, output_tokens: int = 0, cost: Decimal = Decimal(0),
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


def _finish_turn(
    session: Session, owner: str | None, trigger: Trigger, reason: str, *, stop_reason: str, error: str = "",
    actor: str = "", extra: dict[str, Any] | None = None,
) -> None:
    extra = extra or {}
    events: list[tuple[str, dict[str, Any]]] = []
    if error:
        events.append(("error", {"code": "model_error" if trigger == Trigger.FAILURE else stop_reason, "message": error[:500]}))
    add = extra.get("add_fields", {})
    summary = _turn_summary(
        session, stop_reason, add.get("input_tokens", 0), add.get("output_tokens", 0), add.get("cost", Decimal(0)),
        iterations=extra.get("set_fields", {}).get("iteration"),
    )
    step_commit(
        _step(
            session, owner, trigger=trigger, phase=stop_reason, reason=reason, actor=actor,
            events=events,
            after_events=[("turn.finished", {**summary, "reason": reason})],
            set_fields={**extra.get("set_fields", {}), "cancel_requested": False, "last_error": error[:2000]},
            add_fields=extra.get("add_fields", {}),
            model_calls=extra.get("model_calls", []),
        )
    )


def turn_cancel(*, session: Session, reason: str, actor: str = "") -> None:
    """Cancel a turn no worker is running (waiting on a person or a clock)."""
    _finish_turn(session, None, Trigger.CANCEL, reason, stop_reason="cancelled", actor=actor)


def _record_crash(session_id: UUID | str, owner: str) -> None:
    """Turn an unexpected failure into an `error` state the operator can see."""
    try:
        session = Session.objects.get(pk=session_id)
        if State(session.state) in RUNNABLE and session.lease_owner == owner:
            _finish_turn(session, owner, Trigger.FAILURE, "internal error", stop_reason="error", error="internal error while running the step")
    except Exception:  # noqa: BLE001
        logger.exception("could not record the crash of session %s", session_id)
        lease_drop(session_id=session_id, owner=owner)
