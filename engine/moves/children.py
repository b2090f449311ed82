"""Starting child sessions: each an agent's run for the call that asked for it."""

import json

from django.db import IntegrityError, transaction

from engine.gates.children import agent_of, child_started
from engine.moves.turn import build_step, metered_commit, turn_start
from memory.tokens import count_message_tokens
from record import dispatch
from record.events import EventSpec, EventType
from record.models import Agent, Message, Session, ToolCall


def children_started(session: Session, owner: str, started: list[tuple[ToolCall, Session]]) -> None:
    """A `child.started` on the parent's stream for each child just started (no state move):
    a client following the parent finds each child's own stream by its id."""
    events = [EventSpec(EventType.CHILD_STARTED, child_started(c, s)) for c, s in started]
    metered_commit(
        build_step(
            session,
            owner,
            trigger=None,
            phase="children",
            events=events,
            checkpoint={"children": [[c.call_id, str(s.pk)] for c, s in started]},
        )
    )


def children_start(session: Session, calls: list[ToolCall]) -> list[tuple[ToolCall, Session]]:
    """One child per call (the gate checked its agent), each in its own short transaction:
    the session (same owner, role and value, `parent` and `parent_call` set) and its first
    turn with the task as the user message; a worker is woken after the commit. A call whose
    child exists (a re-run after a crash) starts none. Returns the children started now."""
    started: list[tuple[ToolCall, Session]] = []
    for call in calls:
        agent = Agent.objects.filter(slug=agent_of(call)).first()
        if agent is None:
            continue  # deleted since the gate looked: the next look fails the call
        arguments = call.input if isinstance(call.input, dict) else {}
        task = arguments.get("task")
        content = task if isinstance(task, str) and task.strip() else json.dumps(arguments)
        try:
            with transaction.atomic():
                child = Session.objects.create(
                    agent=agent,
                    owner_id=session.owner_id,
                    role=session.role,
                    value=session.value,
                    metadata={"parent": str(session.pk), "call": call.call_id},
                    parent=session,
                    parent_call=call,
                )
                message = Message(
                    session=child,
                    role="user",
                    content=content,
                    token_count=count_message_tokens(content),
                )
                turn_start(session=child, lease_owner=None, message=message)
                dispatch.run_enqueue_on_commit(child.pk, child.value)
        except IntegrityError:
            continue  # started by an earlier run of this step
        started.append((call, child))
    return started
