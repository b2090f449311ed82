"""The open calls of a tool step: prefetched by the model step's commit, in its round trip,
and taken by the tool step only while the session is still at that commit's version."""

import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from approvals.models import Approval
from engine.run_cache import RunContext
from engine.runner.lease import lease_acquire
from engine.runner.loop import _refresh, run_step
from engine.store.open_calls import open_calls
from record.models import ModelEndpoint, Session, ToolCall
from record.rows import json_value
from sessions.services import message_post
from tests.factories import AgentFactory, ToolFactory
from tools.registry import tool_handler

pytestmark = pytest.mark.django_db(transaction=True)


@tool_handler("tests.open_calls.lookup")
def lookup(q: str = "") -> dict[str, Any]:
    return {"q": q, "text": "y" * 300, "n": 1.5e20}


def _agent(model: ModelEndpoint) -> Any:
    """Asks for the same read-only call again and again (the guards are set out of the way)."""
    tool = ToolFactory.create(
        name=f"lookup_{uuid.uuid4().hex[:8]}",
        handler="tests.open_calls.lookup",
        side_effects=False,
        parameters={"type": "object", "properties": {"q": {"type": "string"}}},
    )
    return AgentFactory.create(
        slug=f"lookup-{uuid.uuid4().hex[:8]}",
        model=model,
        tools=[tool.name],
        max_iterations=10,
        repeat_call_limit=10,
        same_result_limit=10,
        rules=[
            {
                "name": "call",
                "tool_calls": [
                    {"tool": tool.name, "args": {"q": "shoes"}},
                    {"tool": tool.name, "args": {"q": "boots"}},
                ],
            }
        ],
    )


@pytest.fixture
def executes() -> Iterator[list[str]]:
    seen: list[str] = []

    def execute(run: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        seen.append(sql)
        return run(sql, params, many, context)

    with connection.execute_wrapper(execute):
        yield seen


def _as_read(session: Session) -> list[dict[str, Any]]:
    """The open calls as the tool step's own query gives them, every attribute."""
    fresh = Session.objects.get(pk=session.pk)
    return [_attrs(c) for c in open_calls(fresh)]


def _attrs(call: ToolCall) -> dict[str, Any]:
    values = {f.attname: getattr(call, f.attname) for f in ToolCall._meta.concrete_fields}
    values["cached_output"] = json_value(call.cached_output)  # type: ignore[attr-defined]
    values["has_approval"] = call.has_approval  # type: ignore[attr-defined]
    return values


def _at_tool_wait(session: Session, run: RunContext, steps: int) -> Session:
    assert lease_acquire(session_id=session.pk, owner="w", seconds=30)
    current = Session.objects.get(pk=session.pk)
    for _ in range(steps):
        assert run_step(current, "w", run)
    assert current.state == "tool_wait"
    return current


def test_the_model_steps_commit_hands_the_tool_step_its_calls(make_session, rules_model, executes):
    session = make_session(agent=_agent(rules_model))
    message_post(session=session, content="go")
    run = RunContext()
    # Two iterations: the second step's calls repeat the first's, whose results are cached.
    current = _at_tool_wait(session, run, 3)
    expected = _as_read(current)
    executes.clear()

    calls = open_calls(current)

    assert executes == []  # nothing read: the rows came with the commit
    assert [_attrs(c) for c in calls] == expected
    assert [c.position for c in calls] == [0, 1]
    # The commit's read saw the rows of the steps before it (the cached results)...
    assert {c["cached_output"]["q"] for c in expected} == {"shoes", "boots"}
    # ...and its own: the calls it opened, still executing.
    assert {c.status for c in calls} == {"executing"}
    assert {c.step for c in calls} == {current.step}


def test_the_prefetched_calls_are_taken_once(make_session, rules_model, executes):
    session = make_session(agent=_agent(rules_model))
    message_post(session=session, content="go")
    current = _at_tool_wait(session, RunContext(), 1)
    first = open_calls(current)
    executes.clear()

    again = open_calls(current)

    assert len(executes) == 1
    assert [_attrs(c) for c in again] == [_attrs(c) for c in first]


def test_a_session_that_moved_since_the_commit_reads_its_calls(make_session, rules_model, executes):
    session = make_session(agent=_agent(rules_model))
    message_post(session=session, content="go")
    current = _at_tool_wait(session, RunContext(), 1)
    # Someone else's commit: a person was asked about the first call, the version moved.
    call = ToolCall.objects.filter(session=session).order_by("position").first()
    Approval.objects.create(
        session=session,
        tool_call=call,
        turn=call.turn,
        step=call.step,
        tool_name=call.tool_name,
        deadline=timezone.now() + timedelta(hours=1),
    )
    Session.objects.filter(pk=session.pk).update(version=current.version + 1)

    # The run loop's re-read (a new object), and the same object told of the new version.
    for moved in (_refresh(session.pk, current), current):
        assert moved is not None
        moved.version = current.version + 1
        executes.clear()

        calls = open_calls(moved)

        assert len(executes) == 1
        assert [c.has_approval for c in calls] == [True, False]  # type: ignore[attr-defined]
