"""Calls answered by another agent's run: an `agent.<slug>` call (a workflow's agent node, an
agent used as a tool) runs that agent's loop as a child session for the same owner and role.

The parent holds no worker while its children run: its tool step starts the children it
lacks and steps aside (`ChildrenWait`); a child's end wakes it (engine/moves/turn.py), and
the sweeper looks again after CHILDREN_RECHECK_S in case that wake-up was lost. Once every
child has ended, each call's outcome is its child's answer, or a tool error the parent can
act on.
"""

import dataclasses
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db import connection
from django.db.models import Q

from engine.gates import Verdict, Wait
from engine.model.context import AGENT_TOOL_PREFIX, HANDOFF_PREFIX
from engine.model.usage import Usage
from record.events import ChildFinished, ChildStarted, EventSpec, EventType
from record.models import Agent, Event, Message, Session, ToolCall, ToolCallStatus, Transition
from record.states import TURN_ENDED, State
from tools.execution import ToolOutcome, ToolSnapshot, tools_for_agent
from tools.rendering import render_failure, render_success

AGENT_TOOL_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "task": {
            "type": "string",
            "minLength": 1,
            "maxLength": 8000,
            "description": "The whole task, self-contained: the agent does not see this conversation",
        }
    },
    "required": ["task"],
    "additionalProperties": False,
}
HANDOFF_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "reason": {
            "type": "string",
            "minLength": 1,
            "maxLength": 500,
            "description": "Why this agent should take the conversation over",
        }
    },
    "required": ["reason"],
    "additionalProperties": False,
}


def _snapshot(name: str, description: str, parameters: dict[str, Any], result: str) -> ToolSnapshot:
    return ToolSnapshot(
        name=name,
        description=description,
        parameters=parameters,
        kind="agent",
        handler="",
        url="",
        method="",
        headers={},
        # No tool timeout: nothing sends an agent tool; the child run is bounded by its own
        # agent's turn_timeout_s and step_timeout_s (a 60 here was shown and never applied).
        timeout_s=0.0,
        side_effects=False,  # the child's own tool calls carry its side effects, once each
        roles=(),
        version="agents-1",
        risk_level=0,
        result_description=result,
    )


def handoff_roles(agent: Agent) -> tuple[str, ...] | None:
    """The roles that may hand a conversation to `agent`: those that may use every one of its
    own tools (the session keeps its role; engine/gates/handoff.py refuses the others).
    () is every role; None is no role at all (two of its tools have no role in common)."""
    own = [n for n in agent.tools if not n.startswith(AGENT_TOOL_PREFIX)]
    allowed: set[str] | None = None
    for tool in tools_for_agent(own).values():
        if tool.roles:
            allowed = set(tool.roles) if allowed is None else allowed & set(tool.roles)
    if allowed is None:
        return ()
    return tuple(sorted(allowed)) or None


def agent_tools(names: list[str], handoffs: list[str]) -> dict[str, ToolSnapshot]:
    """The `agent.<slug>` tools an agent lists and a `transfer_to_<slug>` tool per handoff, for
    the enabled conversational agents among them (a workflow's runtime agent is none). A
    handoff carries the roles that may make it (`handoff_roles`), so a role is offered
    only the handoffs it may make; one no role may make is not offered at all."""
    slugs = {n.removeprefix(AGENT_TOOL_PREFIX) for n in names if n.startswith(AGENT_TOOL_PREFIX)}
    if not slugs and not handoffs:
        return {}
    rows = {
        a.slug: a
        for a in Agent.objects.filter(
            slug__in=slugs | set(handoffs), enabled=True, workflow__isnull=True
        )
    }
    found: dict[str, ToolSnapshot] = {}
    for slug in sorted(slugs & set(rows)):
        title = rows[slug].name or slug
        found[f"{AGENT_TOOL_PREFIX}{slug}"] = _snapshot(
            f"{AGENT_TOOL_PREFIX}{slug}",
            f"Ask the {title} agent to do a task and answer with its result. Use for a part of "
            "the work that agent is made for; several calls in one step run in parallel. "
            "Give the whole task: it does not see this conversation.",
            AGENT_TOOL_PARAMETERS,
            "{answer: the agent's answer, session: its child session}",
        )
    for slug in handoffs:
        roles = handoff_roles(rows[slug]) if slug in rows else None
        if roles is None:
            continue
        title = rows[slug].name or slug
        found[f"{HANDOFF_PREFIX}{slug}"] = dataclasses.replace(
            _snapshot(
                f"{HANDOFF_PREFIX}{slug}",
                f"Hand this conversation over to the {title} agent, which answers the user from "
                "the next step on with the history as it is. Use when the request is that "
                "agent's job, not yours; do not use it to ask a question of it.",
                HANDOFF_PARAMETERS,
                "{transferred_to: slug}",
            ),
            roles=roles,
        )
    return found


class ChildrenWait(Exception):
    """The step waits for child sessions; the run steps aside without a worker."""


def is_agent_call(call: ToolCall) -> bool:
    return call.tool_name.startswith(AGENT_TOOL_PREFIX)


def agent_of(call: ToolCall) -> str:
    return call.tool_name.removeprefix(AGENT_TOOL_PREFIX)


@dataclass
class Children:
    """A children verdict's intent: the agent calls with no child yet (the tool phase starts
    them), and what the children already found tell the results' commit."""

    to_start: list[ToolCall] = field(default_factory=list)
    running: int = 0
    # Children whose `child.started` is not on the parent's stream (a crash came between
    # their start and that event's commit): announced by the parent's next commit.
    unannounced: list[tuple[ToolCall, Session]] = field(default_factory=list)
    # What the children that ended used: counted into the parent's usage when their calls'
    # results commit (once, with them); and a `child.finished` for each.
    usage: Usage = Usage()

    @property
    def waits(self) -> bool:
        return bool(self.to_start or self.running)

    @property
    def announcements(self) -> list[EventSpec]:
        return [
            EventSpec(EventType.CHILD_STARTED, child_started(c, s)) for c, s in self.unannounced
        ]


def child_started(call: ToolCall, child: Session) -> ChildStarted:
    return {"call_id": call.call_id, "session": str(child.pk), "agent": agent_of(call)}


@dataclass(frozen=True)
class Ancestry:
    depth: int  # how many parents stand above the session (0 for a top-level one)
    root: UUID  # the top-level session of its tree
    root_turn: int


def ancestry_of(session: Session) -> Ancestry:
    depth, root, root_turn, parent_id = 0, session.pk, session.turn, session.parent_id
    while parent_id is not None and depth < 50:
        depth += 1
        row = Session.objects.filter(pk=parent_id).values_list("parent_id", "turn").first()
        if row is None:
            break
        root, root_turn, parent_id = parent_id, row[1], row[0]
    return Ancestry(depth=depth, root=root, root_turn=root_turn)


def tree_sessions(ancestry: Ancestry) -> int:
    """How many sessions the root's current turn has created: its children started by calls
    of that turn, and all of theirs (a child lives for one call, so all its own are too)."""
    session_table, call_table = Session._meta.db_table, ToolCall._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            WITH RECURSIVE tree(id) AS (
                SELECT s.id FROM {session_table} s JOIN {call_table} c ON c.id = s.parent_call_id
                WHERE s.parent_id = %s AND c.turn = %s
                UNION ALL
                SELECT s.id FROM {session_table} s JOIN tree t ON s.parent_id = t.id
            )
            SELECT count(*) FROM tree
            """,  # noqa: S608  # nosec B608: the tables are the models' own names
            [ancestry.root, ancestry.root_turn],
        )
        row = cursor.fetchone()
    return int(row[0]) if row else 0


def _too_many_children(asked: int, most: int) -> ToolOutcome:
    return _failed(
        f"too_many_children: one step may start at most {most} agent calls and this one asked "
        f"for {asked}; the first {most} run. Ask for the rest in a later step, once their "
        "answers are in, or do that part yourself."
    )


def _too_many_sessions(most: int) -> ToolOutcome:
    return _failed(
        f"too_many_sessions: this run may create at most {most} agent sessions and has no room "
        "for this call; answer with what you have, without this agent."
    )


def _ended_q() -> Q:
    """A child that has ended, as the gate counts it: its turn over, nothing queued."""
    return Q(state__in=[s.value for s in TURN_ENDED], turn__gt=0, queued_count=0)


def children_running(session_id: UUID | str) -> bool:
    """Whether a child of this session has not ended yet: its end will wake the session.

    Read after the waiting parent gave its lease back: a child that ended while the parent
    still held it had its wake-up refused (`not_acquired`), so with none left running the
    parent must wake itself."""
    return Session.objects.filter(parent__pk=session_id).exclude(_ended_q()).exists()


def _failed(message: str) -> ToolOutcome:
    return ToolOutcome(
        status=ToolCallStatus.FAILED,
        output=None,
        error=message,
        content=render_failure(ToolCallStatus.FAILED, message),
    )


def _ended(child: Session, call: ToolCall) -> ToolOutcome:
    """The child's answer (or why it has none) as the call's outcome; the call took from its
    start to the child's end (the child's run, not the moment its result is read)."""
    outcome = _child_outcome(child)
    outcome.elapsed_ms = max(0, int((child.updated_at - call.created_at).total_seconds() * 1000))
    return outcome


def _child_outcome(child: Session) -> ToolOutcome:
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
    # Why it ended as it did: its error, or the move that ended it (a cancel's reason).
    why = (
        (child.last_error if state == State.ERROR else "")
        or (
            Transition.objects.filter(session=child)
            .order_by("-id")
            .values_list("reason", flat=True)
            .first()
        )
        or state.value
    )
    return _failed(f"the agent's run ended {state.value}: {why} (session {child.pk})")


def children_gate(session: Session, calls: list[ToolCall], max_depth: int) -> Verdict[Children]:
    """Which agent calls have a child that ended (settled, with a `child.finished` each),
    which still run, and which have none yet (to start) or may not start (deeper than the
    agent's max_depth, too many); the step waits while any runs or is to start."""
    found = Children()
    settled: dict[int, ToolOutcome] = {}
    events: list[EventSpec] = []
    agent_calls = sorted((c for c in calls if is_agent_call(c)), key=lambda c: c.position)
    if not agent_calls:
        return Verdict(intent=found)
    most = settings.AGENT_MAX_CHILDREN_PER_STEP
    if len(agent_calls) > most and session.workflow_version_id is None:
        # A model's fan-out: the first calls run, the rest are told why they did not. (A
        # workflow's map of agent nodes is held by its concurrency and the tree's limit.)
        for call in agent_calls[most:]:
            settled[call.pk] = _too_many_children(len(agent_calls), most)
        agent_calls = agent_calls[:most]
    children = {
        s.parent_call_id: s
        for s in Session.objects.filter(parent_call_id__in=[c.pk for c in agent_calls])
    }
    announced = (
        set(
            Event.objects.filter(
                session=session,
                type=EventType.CHILD_STARTED,
                data__session__in=[str(c.pk) for c in children.values()],
            ).values_list("data__session", flat=True)
        )
        if children
        else set()
    )
    ancestry: Ancestry | None = None
    known = set(
        Agent.objects.filter(
            slug__in=[agent_of(c) for c in agent_calls], enabled=True, workflow__isnull=True
        ).values_list("slug", flat=True)
    )
    for call in agent_calls:
        child = children.get(call.pk)
        if child is not None:
            if str(child.pk) not in announced:
                found.unannounced.append((call, child))
            if State(child.state) in TURN_ENDED and child.turn > 0 and child.queued_count == 0:
                settled[call.pk] = _ended(child, call)
                found.usage = found.usage.plus(
                    Usage(child.input_tokens, child.output_tokens, child.cost)
                )
                finished: ChildFinished = {
                    "call_id": call.call_id,
                    "session": str(child.pk),
                    "agent": agent_of(call),
                    "state": child.state,
                }
                events.append(EventSpec(EventType.CHILD_FINISHED, finished))
            else:
                found.running += 1
            continue
        if agent_of(call) not in known:
            settled[call.pk] = _failed(
                f"unknown agent '{agent_of(call)}' (not enabled, or not an agent)"
            )
            continue
        if ancestry is None:
            ancestry = ancestry_of(session)
        if ancestry.depth + 1 > max_depth:
            settled[call.pk] = _failed(
                f"max_depth: agents may nest {max_depth} deep here; answer without this agent"
            )
        else:
            found.to_start.append(call)
    if found.to_start and ancestry is not None:
        made = tree_sessions(ancestry)
        room = max(0, (most_sessions := settings.AGENT_MAX_TREE_SESSIONS) - made)
        for call in found.to_start[room:]:
            settled[call.pk] = _too_many_sessions(most_sessions)
        found.to_start = found.to_start[:room]
    wait = Wait("children") if found.waits else None
    return Verdict(settled=settled, wait=wait, events=tuple(events), intent=found)
