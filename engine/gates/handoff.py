"""A handoff: a `transfer_to_<slug>` call hands the conversation to another agent.

The call is settled here, never by the tool executor: refused (a tool error the model can
act on) when the agent is not one of the current agent's `handoffs` (it was not offered)
or unknown, when one handoff of the step already won, or when the
session's role may not use every tool of that agent (the role stays the session's; an agent
whose tools it could not use would only fail later); accepted otherwise, and the results'
commit then switches the session's agent (a `handoff` transition and `agent.changed`).
"""

from dataclasses import dataclass

from engine.gates import Verdict
from engine.model.context import AGENT_TOOL_PREFIX, HANDOFF_PREFIX
from record.models import Agent, Session, ToolCall, ToolCallStatus
from tools.execution import ToolOutcome, tools_for_agent
from tools.rendering import render_failure, render_success


@dataclass(frozen=True)
class HandoffTo:
    call: ToolCall
    agent: Agent
    reason: str


def _refused(message: str) -> ToolOutcome:
    return ToolOutcome(
        status=ToolCallStatus.FAILED,
        output=None,
        error=message,
        content=render_failure(ToolCallStatus.FAILED, message),
    )


def handoff_barred(session: Session, agent: Agent) -> str:
    """Why `session` may not be handed to `agent` ("" when it may): its role stays the
    session's, and an agent whose tools it could not use would only fail later. The
    model's handoffs and a client's (an Agents SDK handoff between two platform agents,
    openai_compat) are held to it alike."""
    own = [n for n in agent.tools if not n.startswith(AGENT_TOOL_PREFIX)]
    barred = sorted(n for n, t in tools_for_agent(own).items() if not t.allows(session.role))
    if not barred:
        return ""
    return (
        f"handoff to {agent.slug} refused: this conversation's role '{session.role}' may not "
        f"use its tools {', '.join(barred)}"
    )


def handoff_gate(
    session: Session, calls: list[ToolCall], handoffs: list[str]
) -> Verdict[HandoffTo]:
    """The step's `transfer_to_<slug>` calls settled (`handoffs`: the slugs the session's
    current agent may hand over to); the intent: the one chosen, which the results' commit
    switches the session to."""
    settled: dict[int, ToolOutcome] = {}
    chosen: HandoffTo | None = None
    for call in calls:
        if not call.tool_name.startswith(HANDOFF_PREFIX):
            continue
        slug = call.tool_name.removeprefix(HANDOFF_PREFIX)
        if chosen is not None:
            settled[call.pk] = _refused(
                f"the conversation is already handed to {chosen.agent.slug} in this step"
            )
            continue
        agent = (
            Agent.objects.filter(slug=slug, enabled=True, workflow__isnull=True).first()
            if slug in handoffs
            else None
        )
        if agent is None:
            settled[call.pk] = _refused(f"no agent '{slug}' to hand over to")
            continue
        barred = handoff_barred(session, agent)
        if barred:
            settled[call.pk] = _refused(f"{barred}; go on yourself or tell the user")
            continue
        arguments = call.input if isinstance(call.input, dict) else {}
        reason = str(arguments.get("reason") or "")[:500]
        output = {"transferred_to": slug}
        settled[call.pk] = ToolOutcome(
            status=ToolCallStatus.SUCCESS, output=output, content=render_success(output)
        )
        chosen = HandoffTo(call=call, agent=agent, reason=reason)
    return Verdict(settled=settled, intent=chosen)
