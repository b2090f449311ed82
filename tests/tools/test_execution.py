"""Executing tool calls: validation compiled once, role gating, timeouts, and every failure as data."""

import asyncio
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest

from tests.factories import ToolFactory
from tools.execution import (
    FAILURE_MARKER,
    MAX_RESULT_CHARS,
    ToolInvocation,
    ToolSnapshot,
    execute_all,
    execute_one,
    tools_for_agent,
    validator_for,
)
from tools.registry import HANDLERS, UnknownHandler, get_handler, tool_handler

SEEN_KEYS: list[str] = []


@tool_handler("tests.exec.echo")
def echo(text: str) -> dict:
    return {"echo": text, "thread": threading.current_thread().name}


@tool_handler("tests.exec.async_echo")
async def async_echo(text: str) -> dict:
    return {"echo": text}


@tool_handler("tests.exec.sleepy")
async def sleepy(seconds: float) -> dict:
    await asyncio.sleep(seconds)
    return {"slept": seconds}


@tool_handler("tests.exec.raises")
def raises() -> dict:
    raise ValueError("the ledger is locked")


@tool_handler("tests.exec.business_failure")
def business_failure() -> dict:
    return {"ok": False, "error": "customer 9 not found"}


@tool_handler("tests.exec.scalar")
def scalar() -> int:
    return 42


@tool_handler("tests.exec.huge")
def huge() -> dict:
    return {"blob": "x" * (MAX_RESULT_CHARS * 2)}


@tool_handler("tests.exec.keyed", wants_idempotency_key=True)
def keyed(idempotency_key: str) -> dict:
    SEEN_KEYS.append(idempotency_key)
    return {"key": idempotency_key}


def snapshot(name: str = "echo", **fields) -> ToolSnapshot:  # type: ignore[no-untyped-def]
    values = {
        "name": name,
        "description": "a test tool",
        "parameters": {
            "type": "object",
            "properties": {"text": {"type": "string", "minLength": 1}},
            "required": ["text"],
            "additionalProperties": False,
        },
        "kind": "python",
        "handler": "tests.exec.echo",
        "url": "",
        "method": "POST",
        "headers": {},
        "timeout_s": 5.0,
        "side_effects": False,
        "roles": (),
        "version": "v1",
    }
    values.update(fields)
    return ToolSnapshot(**values)


def call(name: str = "echo", arguments=None, **fields) -> ToolInvocation:  # type: ignore[no-untyped-def]
    return ToolInvocation(
        call_id="c1", name=name, arguments={"text": "hi"} if arguments is None else arguments,
        idempotency_key="s:1:1:0:" + name, **fields,
    )  # fmt: skip


def run(invocation: ToolInvocation, *tools: ToolSnapshot, role: str = "support"):  # type: ignore[no-untyped-def]
    return asyncio.run(execute_one(invocation, {t.name: t for t in tools}, role))


# validation ---------------------------------------------------------------------------------


def test_the_validator_is_compiled_once_per_tool_version():
    tool = snapshot(version="2025-01-01")
    first = validator_for(tool)
    assert validator_for(tool) is first
    assert validator_for(snapshot(version="2025-01-01")) is first  # an equal snapshot, same version
    changed = snapshot(version="2025-02-01", parameters={"type": "object", "properties": {}})
    assert validator_for(changed) is not first
    assert validator_for(changed) is validator_for(changed)


@pytest.mark.django_db
def test_a_saved_tool_gets_a_new_validator_version():
    tool = ToolFactory(name="versioned", roles=[])
    before = ToolSnapshot.from_model(tool)
    tool.parameters = {
        "type": "object",
        "properties": {"n": {"type": "integer"}},
        "required": ["n"],
    }
    tool.save()
    after = ToolSnapshot.from_model(tool)
    assert before.version != after.version
    assert validator_for(before) is not validator_for(after)
    assert list(validator_for(after).iter_errors({}))  # the new schema is the one in force


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ({}, "arguments: 'text' is a required property"),
        ({"text": 5}, "text: 5 is not of type 'string'"),
        ({"text": ""}, "text: '' should be non-empty"),
        (
            {"text": "hi", "extra": 1},
            "Additional properties are not allowed ('extra' was unexpected)",
        ),
    ],
)
def test_invalid_arguments_fail_with_a_message_naming_the_field(arguments, expected):
    outcome = run(call(arguments=arguments), snapshot())
    assert outcome.status == "failed"
    assert outcome.output is None
    assert expected in outcome.error
    assert outcome.content.startswith(
        f"{FAILURE_MARKER} (status: failed): invalid arguments for echo"
    )
    assert "Fix them and call again." in outcome.content


def test_arguments_that_were_not_json_are_reported_back():
    outcome = run(call(arguments={}, arguments_error="Expecting value at 1:1"), snapshot())
    assert outcome.status == "failed"
    assert "not valid JSON (Expecting value at 1:1)" in outcome.content


# role gating ----------------------------------------------------------------------------------


def test_an_unknown_tool_is_rejected_listing_the_allowed_ones():
    outcome = run(call(name="launch"), snapshot("echo"), snapshot("clock"))
    assert outcome.status == "rejected"
    assert outcome.content == (
        f"{FAILURE_MARKER} (status: rejected): unknown tool 'launch'. Tools you may use: clock, echo."
    )


def test_a_tool_whose_roles_exclude_the_session_role_is_unknown():
    admin_only = snapshot("wipe", roles=("admin",))
    outcome = run(
        call(name="wipe", arguments={"text": "all"}), admin_only, snapshot("echo"), role="support"
    )
    assert outcome.status == "rejected"
    assert "unknown tool 'wipe'" in outcome.content
    assert "Tools you may use: echo." in outcome.content
    # The same call from an admin session runs.
    assert (
        run(call(name="wipe", arguments={"text": "all"}), admin_only, role="admin").status
        == "success"
    )


def test_a_tool_without_roles_is_open_to_every_role():
    assert snapshot(roles=()).allows("anyone")
    assert run(call(), snapshot(roles=()), role="").status == "success"


@pytest.mark.django_db
def test_tools_for_agent_keeps_enabled_tools_the_role_may_use():
    ToolFactory(name="open", roles=[])
    ToolFactory(name="support_only", roles=["support"])
    ToolFactory(name="admin_only", roles=["admin"])
    ToolFactory(name="disabled", roles=[], enabled=False)
    ToolFactory(name="not_on_agent", roles=[])
    names = ["open", "support_only", "admin_only", "disabled", "missing"]
    assert set(tools_for_agent(names, "support")) == {"open", "support_only"}
    assert set(tools_for_agent(names, "admin")) == {"open", "admin_only"}
    assert set(tools_for_agent(names, "")) == {"open"}


# running --------------------------------------------------------------------------------------


def test_a_sync_handler_runs_off_the_loop_and_succeeds():
    outcome = run(call(), snapshot())
    assert outcome.status == "success"
    assert outcome.output["echo"] == "hi"
    assert outcome.output["thread"] != threading.main_thread().name
    assert outcome.content.startswith('{"echo": "hi"')
    assert outcome.error == ""


def test_an_async_handler_runs_on_the_loop():
    outcome = run(call(), snapshot(handler="tests.exec.async_echo"))
    assert (outcome.status, outcome.output) == ("success", {"echo": "hi"})


def test_a_slow_async_handler_times_out():
    tool = snapshot(
        "sleepy", handler="tests.exec.sleepy", timeout_s=0.05,
        parameters={"type": "object", "properties": {"seconds": {"type": "number"}}},
    )  # fmt: skip
    started = time.perf_counter()
    outcome = run(call("sleepy", {"seconds": 5}), tool)
    assert time.perf_counter() - started < 2
    assert outcome.status == "timeout"
    assert (
        outcome.content
        == f"{FAILURE_MARKER} (status: timeout): sleepy did not answer within 0.05 s."
    )
    assert 40 <= outcome.elapsed_ms < 2000

    fast = run(call("sleepy", {"seconds": 0}), tool)
    assert fast.status == "success"


def test_a_handler_that_raises_is_a_failed_result_not_an_exception():
    tool = snapshot("raises", handler="tests.exec.raises", parameters={"type": "object"})
    outcome = run(call("raises", {}), tool)
    assert outcome.status == "failed"
    assert (
        outcome.content
        == f"{FAILURE_MARKER} (status: failed): raises failed: ValueError: the ledger is locked"
    )


def test_a_handler_reporting_ok_false_is_a_failed_result_with_its_output():
    tool = snapshot("biz", handler="tests.exec.business_failure", parameters={"type": "object"})
    outcome = run(call("biz", {}), tool)
    assert outcome.status == "failed"
    assert outcome.output == {"ok": False, "error": "customer 9 not found"}
    assert outcome.content == f"{FAILURE_MARKER} (status: failed): customer 9 not found"


def test_an_unregistered_handler_is_a_failed_result():
    assert "tests.exec.nowhere" not in HANDLERS
    with pytest.raises(UnknownHandler):
        get_handler("tests.exec.nowhere")
    outcome = run(
        call("ghost", {}),
        snapshot("ghost", handler="tests.exec.nowhere", parameters={"type": "object"}),
    )
    assert outcome.status == "failed"
    assert "misconfigured" in outcome.content and "tests.exec.nowhere" in outcome.content


def test_a_scalar_result_is_wrapped_and_a_huge_one_is_cut():
    assert run(
        call("s", {}), snapshot("s", handler="tests.exec.scalar", parameters={"type": "object"})
    ).output == {"result": 42}
    outcome = run(
        call("h", {}), snapshot("h", handler="tests.exec.huge", parameters={"type": "object"})
    )
    assert outcome.status == "success"
    assert len(outcome.content) < MAX_RESULT_CHARS + 100
    assert "[cut:" in outcome.content


def test_handlers_that_ask_get_the_idempotency_key():
    SEEN_KEYS.clear()
    tool = snapshot("keyed", handler="tests.exec.keyed", parameters={"type": "object"})
    outcome = run(call("keyed", {}), tool)
    assert outcome.output == {"key": "s:1:1:0:keyed"}
    assert SEEN_KEYS == ["s:1:1:0:keyed"]


def test_execute_all_runs_calls_concurrently_and_keeps_the_models_order():
    tool = snapshot(
        "sleepy", handler="tests.exec.sleepy",
        parameters={"type": "object", "properties": {"seconds": {"type": "number"}}},
    )  # fmt: skip
    invocations = [
        ToolInvocation(
            call_id=f"c{i}", name="sleepy", arguments={"seconds": s}, idempotency_key=f"k{i}"
        )
        for i, s in enumerate([0.5, 0.2, 0.4])
    ]
    started = time.perf_counter()
    outcomes = asyncio.run(execute_all(invocations, {"sleepy": tool}, "support"))
    assert time.perf_counter() - started < 1.0  # one after the other would take 1.1 s
    assert [o.output["slept"] for o in outcomes] == [0.5, 0.2, 0.4]


def test_snapshot_version_follows_updated_at():
    class Row:
        name = "t"
        description = "d"
        parameters = None
        kind = "python"
        handler = "h"
        url = ""
        method = ""
        headers = None
        timeout_s = 1.0
        side_effects = False
        roles = None
        updated_at = datetime(2025, 1, 1, tzinfo=UTC)

    snap = ToolSnapshot.from_model(Row())  # type: ignore[arg-type]
    assert snap.parameters == {"type": "object", "properties": {}}
    assert snap.method == "POST" and snap.roles == () and snap.headers == {}
    Row.updated_at += timedelta(seconds=1)
    assert ToolSnapshot.from_model(Row()).version != snap.version  # type: ignore[arg-type]
