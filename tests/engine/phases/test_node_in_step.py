"""A read-only tool node's call run in its node step (engine/phases/node.py, `tool_run_in_step`):
its row, result, tool message and `tool.finished` ride on the commit of the node's output and
the next active nodes; at most one such call a step; everything a call needs committed before
it is sent (a side effect's intent, a person's approval) still takes the ordinary way.

In process (workflow_run_start + session_run, no worker), as tests/engine/phases/test_node.py.
"""

import threading
from collections import Counter
from typing import Any

import pytest
from django.utils import timezone

from billing.models import ToolUsageDaily, UsageDaily
from engine.phases.tools import runs_in_step
from engine.store.open_calls import (
    cached_output_keep,
    cached_output_read,
    calls_by_id,
    finished_keep,
)
from record.models import Checkpoint, Event, Message, Session, ToolCall, Transition
from record.rows import json_value
from sessions.services import session_resume, timers_fire_due
from tests.engine.phases.test_node import KEYS, RAN, _apply, _events, _run, _start, owner
from tests.factories import ToolFactory
from tools.execution import ToolSnapshot
from tools.registry import tool_handler

pytestmark = pytest.mark.django_db(transaction=True)

__all__ = ["owner"]  # the fixture, shared with test_node.py

SEEN: dict[str, Any] = {}
_lock = threading.Lock()


@pytest.fixture(autouse=True)
def _forget_here() -> None:
    RAN.clear()
    KEYS.clear()
    SEEN.clear()


@tool_handler("tests.in_step.add")
def _add(n: int) -> dict[str, Any]:
    with _lock:
        RAN["add"] += 1
    return {"n": n + 1}


@tool_handler("tests.in_step.send", wants_idempotency_key=True)
def _send(n: int, idempotency_key: str = "") -> dict[str, Any]:
    # What was committed about this very call when it was sent.
    call = ToolCall.objects.get(idempotency_key=idempotency_key)
    with _lock:
        RAN["send"] += 1
        SEEN[idempotency_key] = (call.status, call.dispatched_at is not None)
    return {"n": n + 1}


ONCE: Counter[str] = Counter()


@tool_handler("tests.in_step.shaky", wants_idempotency_key=True)
def _shaky(n: int, idempotency_key: str = "") -> dict[str, Any]:
    with _lock:
        RAN["shaky"] += 1
        KEYS.append(idempotency_key)
        ONCE[idempotency_key] += 1
        first = ONCE[idempotency_key] == 1
    if first:
        raise RuntimeError("backend hiccup")  # "shaky failed: ...": transient
    return {"n": n}


def _tools() -> None:
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer"}},
        "required": ["n"],
        "additionalProperties": False,
    }
    ToolFactory(name="add", handler="tests.in_step.add", parameters=schema, roles=["support"])
    ToolFactory(
        name="send",
        handler="tests.in_step.send",
        side_effects=True,
        parameters=schema,
        roles=["support"],
    )
    ToolFactory(
        name="checked_add",
        handler="tests.in_step.add",
        requires_approval=True,
        parameters=schema,
        roles=["support"],
    )
    ToolFactory(name="shaky", handler="tests.in_step.shaky", parameters=schema)


def _chain(slug: str, tools: list[str], **node: Any) -> str:
    lines = [
        f"slug: {slug}",
        "role: support",
        "input: {type: object, properties: {n: {type: integer}}, required: [n]}",
        "start: s1",
        f"result: s{len(tools)}",
        "nodes:",
    ]
    extra = "".join(f", {k}: {v}" for k, v in node.items())
    for i, tool in enumerate(tools, start=1):
        source = "input.n" if i == 1 else f"s{i - 1}.n"
        after = f"s{i + 1}" if i < len(tools) else "end"
        lines.append(
            f"  s{i}: {{kind: tool, tool: {tool}, args: {{n: {source}}}, output: s{i}, next: {after}{extra}}}"
        )
    return "\n".join(lines) + "\n"


def _node_checkpoints(session: Session) -> list[dict[str, Any]]:
    return [
        c.context
        for c in Checkpoint.objects.filter(session=session).order_by("step")
        if "workflow" in c.context
    ]


def test_read_only_tool_nodes_run_in_their_node_steps_one_commit_and_checkpoint_each(
    owner: Any,
) -> None:
    _tools()
    _apply(_chain("adds", ["add", "add", "add"]))
    session = _run(_start(owner, "adds", {"n": 0}))

    assert session.state == "finished"
    assert session.workflow_state["result"] == {"n": 3} and RAN["add"] == 3
    # No tool step: the session never waited for its tools.
    moves = Transition.objects.filter(session=session)
    assert not moves.filter(to_state="tool_wait").exists()
    # One node a step: each step's checkpoint names its node, with the call it ran.
    contexts = _node_checkpoints(session)
    assert [c["nodes"] for c in contexts] == [["s1"], ["s2"], ["s3"]]
    assert [c["done"] for c in contexts] == [[[f"s{i}#1", "success", 1]] for i in (1, 2, 3)]
    assert all(c["pending"] == [] for c in contexts)
    assert contexts[0]["workflow"]["active"] == ["s2"]  # s2 waits for the next step
    # The calls are recorded as a tool step records them: row, message, event.
    calls = list(ToolCall.objects.filter(session=session).order_by("id"))
    assert [(c.call_id, c.status, c.output, c.attempts) for c in calls] == [
        (f"s{i}#1", "success", {"n": i}, 1) for i in (1, 2, 3)
    ]
    assert [c.idempotency_key for c in calls] == [f"{session.pk}:s{i}#1" for i in (1, 2, 3)]
    assert all(c.finished_at is not None and c.risk_level is not None for c in calls)
    assert len({c.step for c in calls}) == 3
    tool_messages = Message.objects.filter(session=session, role="tool").order_by("seq")
    assert [m.tool_call_id for m in tool_messages] == ["s1#1", "s2#1", "s3#1"]
    finished = [
        e.data for e in Event.objects.filter(session=session, type="tool.finished").order_by("seq")
    ]
    assert [(d["call_id"], d["status"], d["output"]) for d in finished] == [
        (f"s{i}#1", "success", {"n": i}) for i in (1, 2, 3)
    ]
    assert [(t, d["node"]) for t, d in _events(session)] == [
        (kind, f"s{i}") for i in (1, 2, 3) for kind in ("node.started", "node.finished")
    ]
    # Metered like any call.
    assert sum(ToolUsageDaily.objects.filter(tool="add").values_list("calls", flat=True)) == 3
    assert sum(UsageDaily.objects.values_list("tool_calls", flat=True)) == 3


def test_a_side_effecting_tool_node_commits_its_intent_before_it_runs(owner: Any) -> None:
    _tools()
    _apply(_chain("sends", ["add", "send", "add"]))
    session = _run(_start(owner, "sends", {"n": 0}))

    assert session.state == "finished" and session.workflow_state["result"] == {"n": 3}
    # When it was sent, its row was committed, executing and marked dispatched.
    assert {f"{session.pk}:s2#1": ("executing", True)} == SEEN
    assert Transition.objects.filter(session=session, to_state="tool_wait").count() == 1
    opened = next(c for c in _node_checkpoints(session) if c["pending"])
    assert opened["pending"] == [["s2#1", f"{session.pk}:s2#1"]]
    assert opened["nodes"] == ["s1"]  # the read-only node before it ran in that step


def test_a_read_only_tool_that_needs_approval_takes_the_ordinary_way(owner: Any) -> None:
    _tools()
    _apply(_chain("checked", ["checked_add"]))
    session = _run(_start(owner, "checked", {"n": 0}))

    assert session.state == "awaiting_approval" and RAN["add"] == 0
    call = ToolCall.objects.get(session=session)
    assert call.status == "executing"


def test_a_transient_failure_in_the_step_is_tried_again_the_ordinary_way_with_its_key(
    owner: Any,
) -> None:
    _tools()
    _apply(_chain("shaky", ["shaky"], retry="{max_attempts: 2, backoff_s: 0}"))
    session = _run(_start(owner, "shaky", {"n": 4}))

    # The call failed in the node step: its row is there, and the retry waits on a timer.
    assert session.state == "waiting_timer" and RAN["shaky"] == 1
    call = ToolCall.objects.get(session=session, tool_name="shaky")
    assert call.status == "failed" and "backend hiccup" in call.error
    Session.objects.filter(pk=session.pk).update(timer_due_at=timezone.now())
    timers_fire_due()
    session = _run(session)

    assert session.state == "finished" and session.workflow_state["result"] == {"n": 4}
    assert RAN["shaky"] == 2 and len(set(KEYS)) == 1  # one logical call, one key
    again = ToolCall.objects.get(session=session, tool_name="shaky")
    assert again.pk == call.pk and again.status == "success"


def test_resuming_a_run_whose_call_failed_in_the_step_sends_it_again(owner: Any) -> None:
    _tools()
    _apply(_chain("fails", ["shaky"]))
    session = _run(_start(owner, "fails", {"n": 2}))
    assert session.state == "error" and RAN["shaky"] == 1

    session_resume(session=session, actor="operator")
    session = _run(session)

    assert session.state == "finished" and RAN["shaky"] == 2 and len(set(KEYS)) == 1


def test_the_cached_output_is_read_by_the_commit_before_and_used_once_at_its_version(
    owner: Any, django_assert_num_queries: Any
) -> None:
    _tools()
    _apply(_chain("adds", ["add", "add"]))
    session = _run(_start(owner, "adds", {"n": 0}))
    earlier = {"n": 0}  # s1's arguments: its call succeeded with {"n": 1}

    cached_output_keep(session, session.version, "add", earlier, [({"kept": True},)])
    with django_assert_num_queries(0):
        assert cached_output_read(session, "add", earlier) == {"kept": True}
    with django_assert_num_queries(1):  # used once
        assert json_value(cached_output_read(session, "add", earlier)) == {"n": 1}
    cached_output_keep(session, session.version - 1, "add", earlier, [({"kept": True},)])
    with django_assert_num_queries(1):  # another version
        assert json_value(cached_output_read(session, "add", earlier)) == {"n": 1}
    cached_output_keep(session, session.version, "add", {"n": True}, [])
    with django_assert_num_queries(1):  # other arguments (true is not 1)
        assert json_value(cached_output_read(session, "add", {"n": 1})) == {"n": 2}


def test_a_node_step_takes_the_calls_the_results_commit_wrote(
    owner: Any, django_assert_num_queries: Any
) -> None:
    _tools()
    _apply(_chain("sends", ["send"]))
    session = _run(_start(owner, "sends", {"n": 0}))
    call = ToolCall.objects.get(session=session)

    finished_keep(session, [call])
    with django_assert_num_queries(0):
        assert calls_by_id(session, ["s1#1"]) == {"s1#1": call}
    with django_assert_num_queries(1):  # used once
        found = calls_by_id(session, ["s1#1"])
    assert found["s1#1"].pk == call.pk and found["s1#1"].output == {"n": 1}
    finished_keep(session, [call])
    with django_assert_num_queries(1):  # a call it does not hold
        assert calls_by_id(session, ["s1#1", "other#1"]).keys() == {"s1#1"}
    finished_keep(session, [call])
    session.version += 1
    with django_assert_num_queries(1):  # another version
        calls_by_id(session, ["s1#1"])


@pytest.mark.parametrize(
    ("change", "in_step"),
    [
        ({}, True),
        ({"kind": "http"}, True),
        ({"side_effects": True}, False),
        ({"requires_approval": True}, False),
        ({"approval_when": {"field": "n", "op": ">", "value": 1}}, False),
        ({"credit_cost": 1}, False),
        ({"risk_level": 2}, False),
        ({"kind": "agent", "handler": ""}, False),  # another agent's loop, a handoff
        ({"handler": "builtin.schedule_followup"}, False),  # a timer
        ({"handler": "builtin.ask_user"}, False),
        ({"handler": "builtin.recall"}, False),
        ({"handler": "builtin.workflow_review"}, False),
    ],
)
def test_which_calls_may_run_in_their_node_step(change: dict[str, Any], in_step: bool) -> None:
    tool = ToolSnapshot(
        name="t",
        description="",
        parameters={"type": "object"},
        kind="python",
        handler="tests.in_step.add",
        url="",
        method="",
        headers={},
        timeout_s=5.0,
        side_effects=False,
        roles=(),
        version="1",
    )
    assert runs_in_step(ToolSnapshot(**{**tool.__dict__, **change})) is in_step
    assert runs_in_step(None) is False
