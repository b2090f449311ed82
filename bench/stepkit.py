"""Engine steps built by hand, the way the engine builds them, for `tools` and `checkpoint`.

A session is started with `message_post` (which commits the turn start) and
leased to this process; then a tool round is committed step by step with the
engine's own pieces (`build_step` + `step_commit`), mirroring what
`model_step` writes for a model that asks for tools (the assistant message,
the ToolCall intent rows, `tool.started` events, the delta checkpoint), then
the tool step (the real `tool_step`, or its results committed as
the `tool_results` move does), then the tool-loop move back to the model. No model
is called; everything else is the engine's code.
"""

import itertools
import uuid
from decimal import Decimal
from typing import Any

from . import fixtures

_steps = itertools.count(10_000)


def leased_sessions(agent: str, count: int) -> list[tuple[Any, str]]:
    """`count` new sessions of `agent`, each in a running turn (processing) under a lease held here."""
    from engine.runner.lease import lease_acquire, worker_identity
    from record.models import Session
    from sessions.services import message_post

    out = []
    for session in fixtures.sessions_create(agent, count):
        message_post(session=session, content="run the tools")
        owner = worker_identity()
        if not lease_acquire(session_id=session.pk, owner=owner, seconds=3600):
            raise RuntimeError(f"could not lease session {session.pk}")
        out.append((Session.objects.get(pk=session.pk), owner))
    return out


def _runtime(session: Any) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    from engine.model.environment import environment
    from engine.run_cache import agent_runtime

    runtime = agent_runtime(session.agent_id)
    tools = runtime.tools_for(session.role)
    return runtime.agent, tools, environment(runtime.agent, tools, runtime.agent.model.name)


def intents_step(session: Any, owner: str, calls: int, tag: str) -> tuple[Any, list[Any]]:
    """The Step a model step commits when the model asks for `calls` no-op tool calls."""
    from engine.gates.guards import canonical_json
    from engine.model.context import tool_calls_json
    from engine.moves.turn import build_step
    from llm.types import ToolCallRequest
    from memory.tokens import count_message_tokens
    from record.events import EventSpec, EventType
    from record.models import Message, ToolCall
    from record.states import Trigger

    agent, _tools, env = _runtime(session)
    # Unique per logical call, as the engine's session:turn:step:position key is; the
    # engine's step number comes from the session's checkpoint counter, ours from a
    # counter of our own so that the checkpoint benchmark may leave checkpoints out.
    step_no = next(_steps)
    requests = [
        ToolCallRequest(
            id=f"call_{uuid.uuid4().hex[:16]}",
            name=fixtures.NOOP_TOOL,
            arguments={"i": position, "tag": tag},
        )
        for position in range(calls)
    ]
    rows = [
        ToolCall(
            turn=session.turn,
            step=step_no,
            position=position,
            call_id=request.id,
            tool_name=request.name,
            input=request.arguments,
            error="",
            idempotency_key=f"{session.pk}:{session.turn}:{step_no}:{position}:{request.name}",
            risk_reason="",  # a db_default the batched insert cannot send (the engine sets it)
        )
        for position, request in enumerate(requests)
    ]
    message = Message(
        turn=session.turn,
        role="assistant",
        content="",
        tool_calls=tool_calls_json(requests),
        token_count=count_message_tokens("", canonical_json(tool_calls_json(requests))),
    )
    step = build_step(
        session,
        owner,
        trigger=Trigger.TOOL_CALLS,
        phase="tool_intent",
        reason=", ".join(c.tool_name for c in rows),
        messages=[message],
        new_tool_calls=rows,
        after_events=[
            EventSpec(
                EventType.TOOL_STARTED,
                {"call_id": c.call_id, "tool": c.tool_name, "input": c.input, "turn": c.turn},
            )
            for c in rows
        ],
        env=env,
        checkpoint={
            "model": agent.model.name,
            "deadline": None,
            "pending": [[c.call_id, c.idempotency_key] for c in rows],
        },
        add_fields={"input_tokens": 100, "output_tokens": 10 * calls, "cost": Decimal(0)},
        model_calls=[],
        set_fields={"iteration": session.iteration + 1, "resume_check": False},
    )
    return step, rows


def results_step(session: Any, owner: str, rows: list[Any]) -> Any:
    """The Step the tool step commits when every call succeeded (as the `tool_results` move builds it)."""
    from django.utils import timezone

    from engine.moves.turn import build_step
    from memory.tokens import count_message_tokens
    from record.events import EventSpec, EventType
    from record.models import Message
    from record.states import Trigger
    from tools.rendering import render_success

    _agent, _tools, env = _runtime(session)
    now = timezone.now()
    messages = []
    events = []
    for call in rows:
        output = {"ok": True}
        content = render_success(output)
        call.status, call.output, call.error, call.elapsed_ms = "success", output, "", 0
        call.finished_at, call.coercions, call.attempts, call.cached = now, [], 1, False
        messages.append(
            Message(
                turn=session.turn,
                role="tool",
                content=content,
                tool_call_id=call.call_id,
                name=call.tool_name,
                data=output,
                token_count=count_message_tokens(content),
            )
        )
        events.append(
            EventSpec(
                EventType.TOOL_FINISHED,
                {
                    "call_id": call.call_id,
                    "tool": call.tool_name,
                    "status": "success",
                    "elapsed_ms": 0,
                    "output": output,
                    "error": "",
                    "cached": False,
                    "coercions": [],
                    "probed": None,
                    "turn": call.turn,
                },
            )
        )
    return build_step(
        session,
        owner,
        trigger=Trigger.TOOL_RESULTS,
        phase="tool_results",
        reason=", ".join(f"{c.tool_name}={c.status}" for c in rows),
        messages=messages,
        updated_tool_calls=rows,
        events=events,
        env=env,
        set_fields={},
        checkpoint={"done": [[c.call_id, c.status, c.attempts] for c in rows]},
    )


def loop_step(session: Any, owner: str) -> Any:
    """The tool-loop move back to the model (the runner's own one-liner)."""
    from engine.moves.turn import build_step
    from record.states import Trigger

    return build_step(session, owner, trigger=Trigger.MODEL_CALL, phase="model")
