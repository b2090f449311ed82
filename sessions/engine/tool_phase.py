"""The tool phase of a step: run the calls whose intent is committed, exactly once.

Side-effecting calls are marked dispatched (committed) just before they are
sent. A call found still executing and dispatched after a crash is uncertain:
the tool's probe is asked with the idempotency key; if it took effect its
result is used, if not (or the probe cannot tell and the tool is idempotent)
it is sent again with the same key; a tool that is not idempotent stops the
session in `error` for an operator instead of guessing.
"""

import asyncio
from datetime import timedelta
from typing import Any

from django.db import connection
from django.utils import timezone

from memory.tokens import count_message_tokens
from runtime import io_loop
from runtime.faults import fault_point
from tools.execution import (
    ProbeResult,
    ToolInvocation,
    ToolOutcome,
    ToolSnapshot,
    execute_all,
    probe,
)
from tools.rendering import render_success

from ..models import Message, Session, ToolCall, ToolCallStatus
from ..rows import json_value
from ..states import Trigger
from .commit import StaleSession, step_commit
from .environment import environment
from .guards import canonical_json
from .runtime_cache import agent_runtime
from .steps import build_step, finish_turn

TIMER_HANDLER = "builtin.schedule_followup"


def _cached_outcomes(
    session: Session, calls: list[ToolCall], tools: dict[str, ToolSnapshot]
) -> dict[int, ToolOutcome]:
    """Read-only calls identical to an earlier successful one in this session reuse its result.

    One query for all of the step's read-only calls; arguments are compared as
    canonical JSON.
    """
    readonly = [
        c
        for c in calls
        if (t := tools.get(c.tool_name)) is not None
        and not t.side_effects
        and isinstance(c.input, dict)
        and not c.error
    ]
    if not readonly:
        return {}
    earlier: dict[tuple[str, str], Any] = {}
    with connection.cursor() as cursor:
        cursor.execute(
            f"""SELECT tool_name, input, output FROM "{ToolCall._meta.db_table}"
                 WHERE session_id = %s AND status = 'success' AND tool_name = ANY(%s) AND NOT (id = ANY(%s))
                 ORDER BY id DESC LIMIT 500""",
            [session.pk, sorted({c.tool_name for c in readonly}), [c.pk for c in readonly]],
        )
        for name, raw_input, raw_output in cursor.fetchall():
            key = (name, canonical_json(json_value(raw_input)))
            earlier.setdefault(key, json_value(raw_output))
    outcomes: dict[int, ToolOutcome] = {}
    for call in readonly:
        found = earlier.get((call.tool_name, canonical_json(call.input)))
        if found is not None:
            outcomes[call.pk] = ToolOutcome(
                status="success",
                output=found,
                content=render_success(found, cached=True),
                extra={"cached": True},
            )
    return outcomes


def _mark_dispatched(session: Session, owner: str, calls: list[ToolCall]) -> None:
    """Commit, before sending, that these side-effecting calls are about to go out.

    Only while this worker still holds the lease and the calls are still
    open: a worker that was paused past its lease (and replaced) must not send
    a side effect the replacement owns now; it raises StaleSession instead.
    """
    if calls:
        now = timezone.now()
        claimed = ToolCall.objects.filter(
            pk__in=[c.pk for c in calls],
            status=ToolCallStatus.EXECUTING,
            session__lease_owner=owner,
            session__version=session.version,
        ).update(dispatched_at=now)
        if claimed != len(calls):
            raise StaleSession(
                f"session {session.pk} was taken over before its tool calls were sent"
            )
        for call in calls:
            call.dispatched_at = now


def tool_step(session: Session, owner: str) -> None:
    """Run the pending tool calls of this turn and commit their results.

    1. Load the calls whose intent was committed, and the tools the role may use.
    2. Reuse cached results of identical read-only calls.
    3. Probe uncertain side-effecting calls (dispatched before a crash).
    4. Mark the side-effecting calls about to be sent as dispatched (commit).
    5. Run the rest concurrently under the agent's step time limit, without
       holding a database connection.
    6. Commit results, tool messages and events in one step; a scheduled
       follow-up moves the session to `waiting_timer` instead.
    """
    runtime = agent_runtime(session.agent_id)
    agent = runtime.agent
    calls = list(
        ToolCall.objects.raw(
            f'SELECT * FROM "{ToolCall._meta.db_table}" WHERE session_id = %s AND turn = %s AND status = %s '
            "ORDER BY step, position",
            [session.pk, session.turn, ToolCallStatus.EXECUTING.value],
        )
    )
    tools = runtime.tools_for(session.role)
    outcomes = _cached_outcomes(session, calls, tools)

    uncertain = [
        c
        for c in calls
        if c.pk not in outcomes
        and c.dispatched_at is not None
        and c.tool_name in tools
        and tools[c.tool_name].side_effects
    ]
    if uncertain:
        probes = io_loop.run(_probe_all(uncertain, tools))
        for call, result in zip(uncertain, probes, strict=True):
            call.probe_outcome = result.verdict
            ToolCall.objects.filter(pk=call.pk).update(probe_outcome=result.verdict)
            if result.verdict == "done":
                output = result.output or {}
                outcomes[call.pk] = ToolOutcome(
                    status="success",
                    output=output,
                    content=render_success(output),
                    extra={"probed": True},
                )
            elif result.verdict == "unknown" and not tools[call.tool_name].idempotent:
                problem = (
                    f"tool {call.tool_name} may or may not have taken effect before a crash "
                    f"(idempotency key {call.idempotency_key}); it does not support idempotent retries and "
                    f"{result.detail or 'has no probe'}, so an operator must check before the run goes on"
                )
                finish_turn(
                    session, owner, Trigger.FAILURE, problem, stop_reason="error", error=problem
                )
                return

    to_run = [c for c in calls if c.pk not in outcomes]
    # Fresh calls and uncertain ones sent again after their probe alike.
    _mark_dispatched(
        session,
        owner,
        [c for c in to_run if c.tool_name in tools and tools[c.tool_name].side_effects],
    )
    env = environment(agent, tools, agent.model.name)
    connection.close()

    invocations = [
        ToolInvocation(
            call_id=c.call_id,
            name=c.tool_name,
            arguments=c.input if isinstance(c.input, dict) else {},
            idempotency_key=c.idempotency_key,
            arguments_error=c.error
            or (None if isinstance(c.input, dict) else "arguments must be a JSON object"),
        )
        for c in to_run
    ]
    ran = io_loop.run(
        execute_all(invocations, tools, session.role, step_timeout_s=agent.step_timeout_s)
    )
    outcomes.update({c.pk: o for c, o in zip(to_run, ran, strict=True)})
    fault_point("before_tool_results_commit")
    _commit_results(session, owner, calls, outcomes, tools, env)


async def _probe_all(calls: list[ToolCall], tools: dict[str, ToolSnapshot]) -> list[ProbeResult]:
    return list(
        await asyncio.gather(*(probe(tools[c.tool_name], c.idempotency_key) for c in calls))
    )


def _commit_results(
    session: Session,
    owner: str,
    calls: list[ToolCall],
    outcomes: dict[int, ToolOutcome],
    tools: dict[str, ToolSnapshot],
    env: dict[str, Any],
) -> None:
    finished_at = timezone.now()
    messages: list[Message] = []
    events: list[tuple[str, dict[str, Any]]] = []
    timer: tuple[int, str] | None = None
    for call in calls:
        outcome = outcomes[call.pk]
        call.status = outcome.status
        call.output = outcome.output
        call.error = outcome.error
        call.elapsed_ms = outcome.elapsed_ms
        call.finished_at = finished_at
        call.coercions = outcome.coercions
        call.attempts = max(call.attempts, 0) + outcome.attempts
        call.cached = bool(outcome.extra.get("cached"))
        snapshot = tools.get(call.tool_name)
        if (
            snapshot is not None
            and snapshot.handler == TIMER_HANDLER
            and outcome.status == "success"
            and outcome.output
        ):
            timer = (
                int(outcome.output.get("after_seconds", 0)),
                str(outcome.output.get("note", "")),
            )
        messages.append(
            Message(
                turn=session.turn,
                role="tool",
                content=outcome.content,
                tool_call_id=call.call_id,
                name=call.tool_name,
                data=outcome.output
                if outcome.output is not None
                else {"error": outcome.error, "status": outcome.status},
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
                    "probed": call.probe_outcome or None,
                    "turn": call.turn,
                },
            )
        )
    set_fields: dict[str, Any] = {}
    trigger = Trigger.TOOL_RESULTS
    if timer is not None:
        # No worker waits on a clock: the due time lives in the row; the sweeper wakes it.
        trigger = Trigger.TIMER_SET
        set_fields = {
            "timer_due_at": timezone.now() + timedelta(seconds=timer[0]),
            "timer_note": timer[1],
        }
    step_commit(
        build_step(
            session,
            owner,
            trigger=trigger,
            phase="tool_results",
            reason=", ".join(f"{c.tool_name}={c.status}" for c in calls),
            messages=messages,
            updated_tool_calls=calls,
            events=events,
            env=env,
            set_fields=set_fields,
            checkpoint={
                "done": [[c.call_id, c.status, c.attempts] for c in calls],
                **({"timer_due": set_fields["timer_due_at"].isoformat()} if timer else {}),
            },
        )
    )
