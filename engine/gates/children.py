"""Calls answered by another agent's run: an `agent.<slug>` call (a workflow's agent node, an
agent used as a tool) runs that agent's loop as a child session for the same owner and role.

The parent holds no worker while its children run: its tool step starts the children it
lacks and steps aside (`ChildrenWait`); a child's end wakes it (engine/moves/turn.py), and
the sweeper looks again after CHILDREN_RECHECK_S in case that wake-up was lost. Once every
child has ended, each call's outcome is its child's answer, or a tool error the parent can
act on.
"""

from dataclasses import dataclass, field

from django.conf import settings

from sessions.models import Agent, Message, Session, ToolCall, ToolCallStatus
from sessions.states import TURN_ENDED, State
from tools.execution import ToolOutcome
from tools.rendering import render_failure, render_success

AGENT_TOOL_PREFIX = "agent."


class ChildrenWait(Exception):
    """The step waits for child sessions; the run steps aside without a worker."""


def is_agent_call(call: ToolCall) -> bool:
    return call.tool_name.startswith(AGENT_TOOL_PREFIX)


def agent_of(call: ToolCall) -> str:
    return call.tool_name.removeprefix(AGENT_TOOL_PREFIX)


@dataclass
class Children:
    outcomes: dict[int, ToolOutcome] = field(default_factory=dict)
    to_start: list[ToolCall] = field(default_factory=list)
    running: int = 0

    @property
    def waits(self) -> bool:
        return bool(self.to_start or self.running)


def depth_of(session: Session) -> int:
    """How many parents stand above this session (0 for a top-level one)."""
    depth, parent_id = 0, session.parent_id
    while parent_id is not None and depth < 50:
        depth += 1
        parent_id = Session.objects.filter(pk=parent_id).values_list("parent_id", flat=True).first()
    return depth


def _failed(message: str) -> ToolOutcome:
    return ToolOutcome(
        status=ToolCallStatus.FAILED,
        output=None,
        error=message,
        content=render_failure(ToolCallStatus.FAILED, message),
    )


def _ended(child: Session) -> ToolOutcome:
    answer = (
        Message.objects.filter(session=child, role="assistant", seq__isnull=False)
        .order_by("-seq")
        .values_list("content", flat=True)
        .first()
    )
    state = State(child.state)
    if state == State.FINISHED:
        output = {"answer": answer or "", "session": str(child.pk)}
        return ToolOutcome(
            status=ToolCallStatus.SUCCESS, output=output, content=render_success(output)
        )
    why = child.last_error or child.cancel_reason or state.value
    return _failed(f"the agent's run ended {state.value}: {why} (session {child.pk})")


def children_gate(session: Session, calls: list[ToolCall]) -> Children:
    """Which agent calls have a child that ended (their outcomes), which still run, and
    which have none yet (to start), or may not start (deeper than CHILDREN_MAX_DEPTH)."""
    found = Children()
    agent_calls = [c for c in calls if is_agent_call(c)]
    if not agent_calls:
        return found
    children = {
        s.parent_call_id: s
        for s in Session.objects.filter(parent_call_id__in=[c.pk for c in agent_calls])
    }
    too_deep: bool | None = None
    known = set(
        Agent.objects.filter(
            slug__in=[agent_of(c) for c in agent_calls], enabled=True, workflow__isnull=True
        ).values_list("slug", flat=True)
    )
    for call in agent_calls:
        child = children.get(call.pk)
        if child is not None:
            if State(child.state) in TURN_ENDED and child.turn > 0 and child.queued_count == 0:
                found.outcomes[call.pk] = _ended(child)
            else:
                found.running += 1
            continue
        if agent_of(call) not in known:
            found.outcomes[call.pk] = _failed(
                f"unknown agent '{agent_of(call)}' (not enabled, or not an agent)"
            )
            continue
        if too_deep is None:
            too_deep = depth_of(session) + 1 > settings.CHILDREN_MAX_DEPTH
        if too_deep:
            found.outcomes[call.pk] = _failed(
                f"max_depth: agents may nest {settings.CHILDREN_MAX_DEPTH} deep; "
                "answer without this agent"
            )
        else:
            found.to_start.append(call)
    return found
