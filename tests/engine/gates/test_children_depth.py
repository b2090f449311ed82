"""`max_depth` counts the levels of agent tools under a top-level session: with 2 (the
default) a session may start a child and that child a grandchild, and no deeper.

Each case builds the chain of sessions and asks the children gate about one `agent.*`
call at the bottom of it: started, or refused with the `max_depth` tool error.
"""

import pytest

from engine.gates.children import children_gate
from record.models import Agent, Session, ToolCall
from tests.factories import AgentFactory, SessionFactory

pytestmark = pytest.mark.django_db


def _chain(levels: int) -> Session:
    """A session with `levels` parents above it."""
    AgentFactory(slug="helper")
    session = SessionFactory()
    for _ in range(levels):
        session = SessionFactory(owner=session.owner, agent=session.agent, parent=session)
    return session


def _agent_call(session: Session) -> ToolCall:
    return ToolCall.objects.create(
        session=session,
        turn=1,
        step=1,
        call_id="c1",
        tool_name="agent.helper",
        input={"task": "look it up"},
        idempotency_key=f"{session.pk}:c1",
    )


@pytest.mark.parametrize(
    ("max_depth", "levels_above", "starts"),
    [
        (0, 0, False),  # 0: no agent tools at all
        (1, 0, True),
        (1, 1, False),
        (2, 0, True),  # the default
        (2, 1, True),  # a child may start a grandchild
        (2, 2, False),  # the grandchild may not go one further
        (3, 2, True),
        (3, 3, False),
    ],
)
def test_agents_nest_exactly_max_depth_levels(
    max_depth: int, levels_above: int, starts: bool
) -> None:
    session = _chain(levels_above)
    call = _agent_call(session)
    found = children_gate(session, [call], max_depth)

    if starts:
        assert found.intent is not None and found.intent.to_start == [call]
        assert call.pk not in found.settled and found.wait is not None
    else:
        assert found.intent is not None and found.intent.to_start == []
        assert "max_depth" in str(found.settled[call.pk])


def test_the_default_max_depth_is_two() -> None:
    assert Agent._meta.get_field("max_depth").default == 2
