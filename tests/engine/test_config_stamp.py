"""The agent configuration stamp (`agent_config_stamp`, migration 0015): what the step
commit returns and `agent_runtime` compares, so an edit takes effect at the next step."""

import json
from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from engine.model.environment import environment, fingerprint
from engine.run_cache import agent_runtime
from engine.store.commit import Step, step_commit
from record.models import Agent, ModelEndpoint, Session
from record.states import Trigger
from sessions.services import message_post
from tests.factories import AgentFactory, ModelEndpointFactory, SessionFactory, ToolFactory
from tools.models import Tool

pytestmark = pytest.mark.django_db

# The stamp's specification: the versions (xmin) of the agent row, its model endpoints
# and its tools (with their ids), in that order.
REFERENCE = """
SELECT concat_ws('|', a.xmin, m.xmin, f.xmin, c.xmin,
       (SELECT string_agg(t.id::text || ':' || t.xmin::text, ',' ORDER BY t.id)
          FROM tools_tool t WHERE t.name = ANY(a.tools)))
  FROM agent_sessions_agent a
  JOIN agent_sessions_modelendpoint m ON m.id = a.model_id
  LEFT JOIN agent_sessions_modelendpoint f ON f.id = a.fallback_model_id
  LEFT JOIN agent_sessions_modelendpoint c ON c.id = a.candidate_model_id
 WHERE a.id = %s"""


def stamp(agent_id: int) -> Any:
    with connection.cursor() as cursor:
        cursor.execute("SELECT agent_config_stamp(%s)", [agent_id])
        return cursor.fetchone()[0]


def reference(agent_id: int) -> Any:
    with connection.cursor() as cursor:
        cursor.execute(REFERENCE, [agent_id])
        row = cursor.fetchone()
        return row[0] if row else None


@pytest.fixture
def agent() -> Agent:
    tools = [ToolFactory.create(), ToolFactory.create()]
    return AgentFactory.create(
        fallback_model=ModelEndpointFactory.create(name="fallback", api="rules"),
        tools=[t.name for t in tools],
    )


def test_the_stamp_is_the_reference_text_and_none_for_a_missing_agent(agent: Agent) -> None:
    assert stamp(agent.pk) == reference(agent.pk)
    assert stamp(agent.pk).count("|") == 3  # agent, model, fallback, tools; no candidate
    assert stamp(agent.pk).split("|")[-1].count(",") == 1  # both tools
    assert stamp(0) is None


@pytest.mark.parametrize(
    "edit",
    [
        lambda a: Agent.objects.filter(pk=a.pk).update(system_prompt="Changed."),
        lambda a: ModelEndpoint.objects.filter(pk=a.model_id).update(model="other"),
        lambda a: ModelEndpoint.objects.filter(pk=a.fallback_model_id).update(total_timeout_s=7),
        lambda a: Tool.objects.filter(name=a.tools[1]).update(description="Changed."),
        lambda a: Tool.objects.filter(name=a.tools[0]).delete(),
    ],
    ids=["agent", "model", "fallback", "tool", "tool-gone"],
)
def test_any_edit_of_the_rows_changes_the_stamp_and_reloads_the_runtime(
    agent: Agent, edit: Any
) -> None:
    before = agent_runtime(agent.pk)
    assert agent_runtime(agent.pk) is before  # unchanged: the cached runtime
    edit(agent)
    assert stamp(agent.pk) == reference(agent.pk) != before.stamp[0]
    after = agent_runtime(agent.pk)
    assert after is not before and after.stamp == (stamp(agent.pk),)


def test_reads_and_row_locks_leave_the_stamp_alone(agent: Agent) -> None:
    before = stamp(agent.pk)
    with transaction.atomic():
        list(Agent.objects.select_for_update().filter(pk=agent.pk))
        list(Tool.objects.select_for_update().filter(name__in=agent.tools))
        list(ModelEndpoint.objects.select_for_update().filter(pk=agent.model_id))
    agent_runtime(agent.pk)
    assert stamp(agent.pk) == before


def test_a_step_commit_returns_the_stamp_for_the_next_step(agent: Agent) -> None:
    session = SessionFactory.create(agent=agent)
    message_post(session=session, content="hi")
    session = Session.objects.get(pk=session.pk)
    step_commit(Step(session=session, trigger=Trigger.ANSWER))
    assert session.config_stamp == (session.version, stamp(agent.pk))  # type: ignore[attr-defined]
    runtime = agent_runtime(agent.pk)
    # The next step trusts it, with no query of its own.
    with CaptureQueriesContext(connection) as queries:
        assert agent_runtime(agent.pk, session) is runtime
    assert len(queries) == 0


def test_a_runtime_works_out_each_roles_environment_once(agent: Agent) -> None:
    runtime = agent_runtime(agent.pk)
    env = runtime.environment("support")
    assert runtime.environment("support") is env
    assert env == environment(runtime.agent, runtime.tools_for("support"), agent.model.name)
    assert env.fingerprint == fingerprint(dict(env))  # as a plain dict's digest
    assert json.loads(json.dumps(env)) == env  # stored in checkpoints as it is

    Agent.objects.filter(pk=agent.pk).update(system_prompt="Changed.")
    changed = agent_runtime(agent.pk).environment("support")
    assert changed["agent"] != env["agent"] and changed.fingerprint != env.fingerprint
