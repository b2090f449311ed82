"""Executing tool calls: validation compiled once, role gating, time limits, retries, the breaker,
HTTP tools (secrets from the environment, Idempotency-Key), and every failure as data."""

import asyncio
import email.utils
import json
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Coroutine
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings

from runtime import io_loop
from runtime.retry import RetryPolicy
from tests.factories import ToolFactory
from tools import execution
from tools.execution import (
    FAILURE_MARKER,
    MAX_RESULT_CHARS,
    ToolInvocation,
    ToolSnapshot,
    execute_all,
    execute_one,
    tool_breaker,
    tools_for_agent,
    validator_for,
)
from tools.registry import HANDLERS, UnknownHandler, get_handler, tool_handler
from tools.result_limits import is_cut
from tools.validation import MAX_ARGUMENT_BYTES

from .http_server import Answer, Drop, Firehose, ScriptedApi

SEEN_KEYS: list[str] = []
CALLS: Counter[str] = Counter()
FAILING: set[str] = set()


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


@tool_handler("tests.exec.slow_once")
async def slow_once(token: str) -> dict:
    """Hangs on its first call for a token, answers at once after that."""
    CALLS[token] += 1
    if CALLS[token] == 1:
        await asyncio.sleep(5)
    return {"token": token, "call": CALLS[token]}


@tool_handler("tests.exec.flaky")
def flaky(token: str) -> dict:
    """Raises while its token is in FAILING; counts every call."""
    CALLS[token] += 1
    if token in FAILING:
        raise RuntimeError("the ledger is down")
    return {"token": token}


@tool_handler("tests.exec.raises")
def raises() -> dict:
    raise ValueError("the ledger is locked")


@tool_handler("tests.exec.business_failure")
def business_failure() -> dict:
    return {"ok": False, "error": "customer 9 not found"}


# What a provider or a tool might echo back: a password, an e-mail address, a card number.
ECHOED = "login jane.roe@example.org password=hunter2-Secret card 4242 4242 4242 4242"
LEAKS = ("jane.roe@example.org", "hunter2-Secret", "4242 4242 4242 4242")


@tool_handler("tests.exec.raises_echo")
def raises_echo() -> dict:
    raise RuntimeError(f"the ledger refused: {ECHOED}")


@tool_handler("tests.exec.business_echo")
def business_echo() -> dict:
    return {"ok": False, "error": f"not allowed: {ECHOED}", "detail": {"who": ECHOED}}


@tool_handler("tests.exec.scalar")
def scalar() -> int:
    return 42


@tool_handler("tests.exec.huge")
def huge() -> dict:
    return {"blob": "x" * (MAX_RESULT_CHARS * 2)}


@tool_handler("tests.exec.big")
def big() -> dict:
    return {"rows": [{"id": i, "text": "é" * 100} for i in range(5_000)]}


@tool_handler("tests.exec.keyed", wants_idempotency_key=True)
def keyed(idempotency_key: str) -> dict:
    SEEN_KEYS.append(idempotency_key)
    return {"key": idempotency_key}


def snapshot(name: str = "echo", **fields: Any) -> ToolSnapshot:
    values: dict[str, Any] = {
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


def token_tool(name: str, handler: str, **fields: Any) -> ToolSnapshot:
    schema = {"type": "object", "properties": {"token": {"type": "string"}}, "required": ["token"]}
    return snapshot(name, handler=handler, parameters=schema, **fields)


def http_tool(name: str, url: str, **fields: Any) -> ToolSnapshot:
    schema = {
        "type": "object",
        "properties": {"number": {"type": "string"}, "amount": {"type": "number"}},
    }
    return snapshot(name, kind="http", handler="", url=url, parameters=schema, **fields)


def call(
    name: str = "echo", arguments: Any = None, key: str | None = None, **fields: Any
) -> ToolInvocation:
    return ToolInvocation(
        call_id="c1", name=name, arguments={"text": "hi"} if arguments is None else arguments,
        idempotency_key=key or "s:1:1:0:" + name, **fields,
    )  # fmt: skip


def on_loop(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run on the process's shared I/O loop, as the engine does."""
    return io_loop.run(coro, timeout=30)


def run(invocation: ToolInvocation, *tools: ToolSnapshot, role: str = "support"):  # type: ignore[no-untyped-def]
    return on_loop(execute_one(invocation, {t.name: t for t in tools}, role))


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


# validation ---------------------------------------------------------------------------------


def test_the_validator_is_compiled_once_per_tool_version(monkeypatch):
    compiled: list[dict] = []
    real = execution.compile_validator
    monkeypatch.setattr(
        execution, "compile_validator", lambda schema: compiled.append(schema) or real(schema)
    )
    name = unique("compiled")
    tool = snapshot(name, version="2025-01-01")

    first = validator_for(tool)
    for _ in range(5):
        assert run(call(name), tool).status == "success"
    assert validator_for(tool) is first
    assert (
        validator_for(snapshot(name, version="2025-01-01")) is first
    )  # an equal snapshot, same version
    assert len(compiled) == 1

    changed = snapshot(name, version="2025-02-01", parameters={"type": "object", "properties": {}})
    assert validator_for(changed) is not first
    assert validator_for(changed) is validator_for(changed)
    assert len(compiled) == 2


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
        ({}, "text is required but missing"),
        ({"text": True}, "text must be a string; got true"),
        ({"text": ""}, "text must have at least 1 characters; got 0"),
        ({"text": "hi", "extra": 1}, "unexpected field(s) extra in arguments; allowed: text"),
    ],
)
def test_invalid_arguments_fail_with_a_message_naming_the_field(arguments, expected):
    outcome = run(call(arguments=arguments), snapshot())
    assert outcome.status == "failed"
    assert outcome.output is None
    assert outcome.attempts == 0  # the tool never ran
    assert outcome.content == (
        f"{FAILURE_MARKER} (status: failed): invalid arguments for echo: {expected}. Fix them and call again."
    )


def test_all_wrong_fields_are_reported_in_one_result():
    tool = snapshot(
        "dates",
        parameters={
            "type": "object",
            "properties": {
                "days": {"type": "integer"},
                "end_date": {"type": "string", "format": "date"},
            },
            "required": ["days", "end_date"],
            "additionalProperties": False,
        },
    )
    outcome = run(call("dates", {"days": "seven", "end_date": "2025/1/15", "colour": "red"}), tool)
    assert outcome.status == "failed"
    assert outcome.error == (
        "invalid arguments for dates: unexpected field(s) colour in arguments; allowed: days, end_date; "
        'days must be an integer; got "seven"; '
        'end_date must be a date in YYYY-MM-DD format; got "2025/1/15". Fix them and call again.'
    )


def test_coercions_are_applied_and_reported_on_the_outcome():
    tool = snapshot(
        "count", handler="tests.exec.sleepy",
        parameters={"type": "object", "properties": {"seconds": {"type": "integer"}}, "required": ["seconds"]},
    )  # fmt: skip
    outcome = run(call("count", {"seconds": "0"}), tool)
    assert outcome.status == "success"
    assert outcome.output == {"slept": 0}
    assert outcome.coercions == ['seconds: "0" -> 0']


def test_arguments_that_were_not_json_are_reported_back():
    outcome = run(call(arguments={}, arguments_error="Expecting value at 1:1"), snapshot())
    assert outcome.status == "failed"
    assert outcome.content == (
        f"{FAILURE_MARKER} (status: failed): arguments are not valid JSON (Expecting value at 1:1); send a JSON object."
    )


def test_arguments_that_are_not_an_object_are_refused():
    outcome = run(call(arguments=["hi"]), snapshot())
    assert outcome.status == "failed"
    assert "arguments must be a JSON object; got list" in outcome.content


def test_huge_arguments_are_refused_without_running_the_tool():
    outcome = run(call(arguments={"text": "x" * (MAX_ARGUMENT_BYTES + 1)}), snapshot())
    assert outcome.status == "failed" and outcome.attempts == 0
    assert f"the limit is {MAX_ARGUMENT_BYTES}. Send less data." in outcome.content
    assert len(outcome.content) < 300


# role gating ----------------------------------------------------------------------------------


def test_an_unknown_tool_is_rejected_listing_the_allowed_ones():
    outcome = run(call(name="launch"), snapshot("echo"), snapshot("clock"))
    assert outcome.status == "rejected"
    assert outcome.content == (
        f"{FAILURE_MARKER} (status: rejected): unknown tool 'launch'. Tools you may use: clock, echo."
    )


def test_the_refusal_names_the_tools_as_the_model_spells_them():
    tools = (snapshot("parcels.track_parcel"), snapshot("clock"))
    dotted = run(call(name="parcels.track"), *tools)  # a model that sees the stored names
    wired = run(call(name="parcels__track"), *tools)  # one behind a wire that renames them
    assert dotted.content.endswith("Tools you may use: clock, parcels.track_parcel.")
    assert wired.content.endswith("Tools you may use: clock, parcels__track_parcel.")


def test_a_hidden_tool_gets_exactly_the_answer_an_unknown_one_gets_and_never_runs():
    SEEN_KEYS.clear()
    hidden = snapshot(
        "wipe", handler="tests.exec.keyed", parameters={"type": "object"}, roles=("admin",)
    )
    tools = (hidden, snapshot("echo", roles=("support",)))
    refused = run(call("wipe", {}), *tools, role="support")
    unknown = run(call("wipe_all", {}), *tools, role="support")
    assert refused.status == unknown.status == "rejected"
    assert refused.content == unknown.content.replace("wipe_all", "wipe")
    assert refused.content.endswith("Tools you may use: echo.")
    assert SEEN_KEYS == []
    # The same call from an admin session runs.
    assert run(call("wipe", {}), *tools, role="admin").status == "success"
    assert SEEN_KEYS == ["s:1:1:0:wipe"]


def test_a_tool_without_roles_is_open_to_every_role():
    assert snapshot(roles=()).allows("anyone")
    assert run(call(), snapshot(roles=()), role="").status == "success"


@pytest.mark.parametrize(
    ("name", "shown"),
    [
        ("rm -rf /", '"rm -rf /"'),
        ("functions.get_order", '"functions.get_order"'),
        ("", '""'),
        ("x\ny", '"x\\ny"'),
        ("a" * 300, '"' + "a" * 64 + '\\u2026"'),
        ("订单查询", "'订单查询'"),
    ],
)
def test_a_tool_name_with_odd_characters_is_refused_and_shown_safely(name, shown):
    outcome = run(call(name=name, arguments={}), snapshot("echo"))
    assert outcome.status == "rejected"
    assert (
        outcome.content
        == f"{FAILURE_MARKER} (status: rejected): unknown tool {shown}. Tools you may use: echo."
    )


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


def test_a_sync_handler_runs_off_the_loop_and_its_result_is_compact_text():
    outcome = run(call(), snapshot())
    assert outcome.status == "success" and outcome.attempts == 1
    assert outcome.output["echo"] == "hi"
    assert outcome.output["thread"] not in (threading.main_thread().name, "io-loop")
    assert outcome.content == f"echo: hi, thread: {outcome.output['thread']}"
    assert outcome.error == ""


def test_an_async_handler_runs_on_the_loop():
    outcome = run(call(), snapshot(handler="tests.exec.async_echo"))
    assert (outcome.status, outcome.output, outcome.content) == (
        "success",
        {"echo": "hi"},
        "echo: hi",
    )


def test_a_slow_read_only_call_times_out_after_one_retry():
    # Failures count in the tool's (shared, Redis) breaker: a name of its own per test.
    name = unique("sleepy")
    tool = snapshot(
        name, handler="tests.exec.sleepy", timeout_s=0.05,
        parameters={"type": "object", "properties": {"seconds": {"type": "number"}}},
    )  # fmt: skip
    started = time.perf_counter()
    outcome = run(call(name, {"seconds": 5}), tool)
    assert time.perf_counter() - started < 2
    assert outcome.status == "timeout"
    assert outcome.attempts == 2
    assert (
        outcome.content
        == f"{FAILURE_MARKER} (status: timeout): {name} did not answer within 0.05 s,"
        " 2 times (0.1 s in all)."
    )
    assert 90 <= outcome.elapsed_ms < 2000  # two attempts of 50 ms

    fast = run(call(name, {"seconds": 0}), tool)
    assert (fast.status, fast.attempts) == ("success", 1)


def test_a_read_only_call_that_timed_out_once_is_retried_and_succeeds():
    token = unique("slow")
    tool = token_tool(unique("lookup"), "tests.exec.slow_once", timeout_s=0.1)
    outcome = run(call(tool.name, {"token": token}), tool)
    assert (outcome.status, outcome.attempts) == ("success", 2)
    assert outcome.output == {"token": token, "call": 2}
    assert CALLS[token] == 2


def test_a_side_effect_call_that_times_out_is_not_retried():
    token = unique("slow")
    tool = token_tool(unique("charge"), "tests.exec.slow_once", timeout_s=0.1, side_effects=True)
    outcome = run(call(tool.name, {"token": token}), tool)
    assert (outcome.status, outcome.attempts) == ("timeout", 1)
    assert CALLS[token] == 1


def test_a_handler_that_raises_is_a_failed_result_not_an_exception():
    name = unique("raises")
    tool = snapshot(name, handler="tests.exec.raises", parameters={"type": "object"})
    outcome = run(call(name, {}), tool)
    assert outcome.status == "failed"
    assert outcome.attempts == 1  # an error inside the tool is not retried
    assert (
        outcome.content
        == f"{FAILURE_MARKER} (status: failed): {name} failed: ValueError: the ledger is locked"
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
    scalar_tool = snapshot("s", handler="tests.exec.scalar", parameters={"type": "object"})
    assert run(call("s", {}), scalar_tool).output == {"result": 42}
    outcome = run(
        call("h", {}), snapshot("h", handler="tests.exec.huge", parameters={"type": "object"})
    )
    assert outcome.status == "success"
    assert outcome.output == {"blob": "x" * (MAX_RESULT_CHARS * 2)}  # stored whole
    assert len(outcome.content) < MAX_RESULT_CHARS + 100
    assert "[cut:" in outcome.content


def test_a_python_result_over_the_limit_is_cut_with_a_marker():
    outcome = run(
        call("b", {}), snapshot("b", handler="tests.exec.big", parameters={"type": "object"})
    )
    assert outcome.status == "success"
    assert is_cut(outcome.output)
    limit = settings.TOOL_RESULT_MAX_BYTES
    compact = json.dumps(outcome.output, ensure_ascii=False, separators=(",", ":"))
    assert len(compact.encode()) <= limit
    assert outcome.output["result_cut"]["original_bytes"] > 4 * limit
    assert outcome.content.startswith("[RESULT CUT]")


def test_a_50_mb_http_answer_is_read_no_further_than_the_limit():
    size = 50 * 1024 * 1024
    with Firehose(size) as api:
        tool = http_tool(unique("export"), api.url("/export"), method="GET")
        outcome = run(call(tool.name, {}), tool)
        assert api.finished.wait(10), "the server was still sending"
    assert not api.completed
    # What the client read, plus what the sockets' buffers held when it hung up.
    assert api.sent < 10 * 1024 * 1024, api.sent
    assert outcome.status == "success"
    cut = outcome.output
    assert is_cut(cut) and len(json.dumps(cut).encode()) <= settings.TOOL_RESULT_MAX_BYTES
    assert cut["result_cut"]["original_bytes"] == size  # from Content-Length
    assert cut["partial_result"].startswith('{"rows":"xxxx')
    assert outcome.content.startswith("[RESULT CUT] This result was 52,428,800 bytes")


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
    outcomes = on_loop(execute_all(invocations, {"sleepy": tool}, "support"))
    assert time.perf_counter() - started < 1.0  # one after the other would take 1.1 s
    assert [o.output["slept"] for o in outcomes] == [0.5, 0.2, 0.4]


def test_the_step_time_limit_reports_calls_still_running_as_timeouts():
    tool = snapshot(
        "sleepy", handler="tests.exec.sleepy", timeout_s=10,
        parameters={"type": "object", "properties": {"seconds": {"type": "number"}}},
    )  # fmt: skip
    invocations = [
        ToolInvocation(
            call_id="slow", name="sleepy", arguments={"seconds": 5}, idempotency_key="k1"
        ),
        ToolInvocation(
            call_id="fast", name="sleepy", arguments={"seconds": 0}, idempotency_key="k2"
        ),
        ToolInvocation(call_id="bad", name="nope", arguments={}, idempotency_key="k3"),
    ]
    started = time.perf_counter()
    slow, fast, bad = on_loop(
        execute_all(invocations, {"sleepy": tool}, "support", step_timeout_s=0.3)
    )
    assert time.perf_counter() - started < 1.5
    assert slow.status == "timeout"
    assert slow.content == (
        f"{FAILURE_MARKER} (status: timeout): sleepy was stopped: the step's time limit of 0.3 s ran out."
    )
    assert 250 <= slow.elapsed_ms < 1500
    assert (fast.status, fast.output) == ("success", {"slept": 0})
    assert bad.status == "rejected"


def test_execute_all_with_nothing_to_do():
    assert on_loop(execute_all([], {}, "support")) == []


def test_snapshot_version_follows_the_schema_and_it_carries_every_field():
    class Row:
        name = "t"
        description = "d"
        parameters = None
        kind = "http"
        handler = ""
        url = "http://api.example/things"
        method = ""
        headers = None
        status_url = "http://api.example/things/status"
        probe_handler = ""
        precheck_url = ""
        precheck_handler = ""
        idempotent = False
        timeout_s = 1.0
        side_effects = True
        requires_approval = True
        risk_level = 3
        roles = None
        result_description = "The things."
        approval_when = None
        approval_timeout_s = 1800
        approval_on_timeout = "reject"
        approval_escalate_to = ""
        credit_cost = 25
        value = "double(args.amount)"
        cost = ""
        critical = False
        rate_limit_calls_per_min = 0
        rate_limit_tokens_per_min = 0
        sla_rate = 0.95
        quota = {"calls": 5000, "per": "day"}
        retry = {"attempts": 4, "on": ["429"]}
        updated_at = datetime(2025, 1, 1, tzinfo=UTC)

    snap = ToolSnapshot.from_model(Row())  # type: ignore[arg-type]
    assert snap.result_description == "The things."
    assert (snap.retry.attempts, snap.retry.on) == (4, frozenset({"429"}))
    assert snap.credit_cost == 25
    assert (snap.value, snap.cost, snap.paid) == ("double(args.amount)", "", True)
    assert (snap.sla_rate, snap.quota_calls, snap.quota_per) == (0.95, 5000, "day")
    assert snap.parameters == {"type": "object", "properties": {}}
    assert snap.method == "POST" and snap.roles == () and snap.headers == {}
    assert (snap.status_url, snap.idempotent, snap.requires_approval, snap.risk_level) == (
        "http://api.example/things/status", False, True, 3,
    )  # fmt: skip
    # The version (the compiled validator's cache key) follows the schema itself,
    # even when a change leaves updated_at alone (a queryset update).
    Row.updated_at += timedelta(seconds=1)
    assert ToolSnapshot.from_model(Row()).version == snap.version  # type: ignore[arg-type]
    Row.parameters = {"type": "object", "properties": {"n": {"type": "integer"}}}
    assert ToolSnapshot.from_model(Row()).version != snap.version  # type: ignore[arg-type]


# HTTP tools -----------------------------------------------------------------------------------


def test_an_http_tool_sends_the_idempotency_key_and_secret_headers_from_the_environment(
    monkeypatch,
):
    monkeypatch.setenv("TOOL_SECRET_TESTS_EXEC_API_TOKEN", "s3cret-token")
    with ScriptedApi(Answer(201, {"ok": True, "coupon_code": "CPN-1", "amount": "10.00"})) as api:
        tool = http_tool(
            unique("issue"), api.url("/coupons"), side_effects=True,
            headers={"Authorization": {"env": "TOOL_SECRET_TESTS_EXEC_API_TOKEN"}, "X-Client": "agentplatform"},
        )  # fmt: skip
        outcome = run(call(tool.name, {"amount": "10"}, key="sess:1:2:0:issue"), tool)
        (seen,) = api.requests
    assert outcome.status == "success"
    assert outcome.output == {"ok": True, "coupon_code": "CPN-1", "amount": "10.00"}
    assert outcome.content == "ok: true, coupon_code: CPN-1, amount: 10.00"
    assert (seen.method, seen.path, seen.body) == ("POST", "/coupons", {"amount": 10})
    assert outcome.coercions == ['amount: "10" -> 10']
    assert seen.headers["idempotency-key"] == "sess:1:2:0:issue"
    assert seen.headers["authorization"] == "s3cret-token"
    assert seen.headers["x-client"] == "agentplatform"
    # The secret lives in the environment only: the definition names the variable.
    assert "s3cret-token" not in repr(tool)


def test_a_get_tool_sends_its_arguments_as_the_query():
    with ScriptedApi(Answer(200, {"ok": True, "order_number": "SO-1001"})) as api:
        tool = http_tool(unique("get_order"), api.url("/orders/lookup"), method="GET")
        outcome = run(call(tool.name, {"number": "SO-1001"}), tool)
        (seen,) = api.requests
    assert outcome.status == "success"
    assert (seen.method, seen.path, seen.query, seen.body) == (
        "GET",
        "/orders/lookup",
        {"number": "SO-1001"},
        None,
    )
    assert seen.headers["idempotency-key"] == f"s:1:1:0:{tool.name}"


def test_a_business_error_from_the_api_is_a_failed_result_for_the_model():
    with ScriptedApi(
        Answer(404, {"ok": False, "error": "order SO-9 not found; check the order number"})
    ) as api:
        tool = http_tool(unique("get_order"), api.url("/orders/lookup"), method="GET")
        outcome = run(call(tool.name, {"number": "SO-9"}), tool)
        assert len(api.requests) == 1  # the API answered: no retry
    assert outcome.status == "failed" and outcome.attempts == 1
    assert outcome.output == {"ok": False, "error": "order SO-9 not found; check the order number"}
    assert outcome.content == (
        f"{FAILURE_MARKER} (status: failed): {tool.name} refused the call: "
        "HTTP 404: order SO-9 not found; check the order number"
    )
    assert tool_breaker().state(tool.name).failures == 0  # not an outage


def test_a_read_only_http_tool_is_retried_once_after_a_transport_error():
    with ScriptedApi() as api:
        api.script(Drop(), Answer(200, {"ok": True, "order_number": "SO-1"}))
        tool = http_tool(unique("get_order"), api.url("/orders/lookup"), method="GET")
        outcome = run(call(tool.name, {"number": "SO-1"}), tool)
        seen = api.requests
    assert (outcome.status, outcome.attempts) == ("success", 2)
    assert outcome.output == {"ok": True, "order_number": "SO-1"}
    assert len(seen) == 2
    assert seen[0].headers["idempotency-key"] == seen[1].headers["idempotency-key"]


def test_a_read_only_http_tool_is_retried_once_after_a_server_error_then_gives_up():
    with ScriptedApi(Answer(503, {"error": "maintenance"})) as api:
        tool = http_tool(unique("get_order"), api.url("/orders/lookup"), method="GET")
        outcome = run(call(tool.name, {"number": "SO-1"}), tool)
        assert len(api.requests) == 2
    assert (outcome.status, outcome.attempts) == ("failed", 2)
    assert outcome.content.startswith(
        f"{FAILURE_MARKER} (status: failed): {tool.name} could not be reached"
    )


def test_a_read_only_http_tool_is_retried_once_after_a_timeout():
    with ScriptedApi() as api:
        api.script(Answer(200, {"late": True}, delay_s=1.0), Answer(200, {"ok": True}))
        tool = http_tool(
            unique("get_order"), api.url("/orders/lookup"), method="GET", timeout_s=0.3
        )
        outcome = run(call(tool.name, {"number": "SO-1"}), tool)
        assert len(api.requests) == 2
    assert (outcome.status, outcome.attempts, outcome.output) == ("success", 2, {"ok": True})


def test_a_side_effect_http_tool_is_not_retried_after_a_transport_error():
    with ScriptedApi() as api:
        api.script(Drop(), Answer(201, {"ok": True}))
        tool = http_tool(unique("issue"), api.url("/coupons"), side_effects=True)
        outcome = run(call(tool.name, {"amount": 5}), tool)
        assert len(api.requests) == 1
    assert (outcome.status, outcome.attempts) == ("failed", 1)
    assert outcome.content == (
        f"{FAILURE_MARKER} (status: failed): {tool.name} could not be reached: RemoteProtocolError"
    )


def test_a_side_effect_http_tool_is_not_retried_after_a_timeout():
    with ScriptedApi(Answer(201, {"ok": True}, delay_s=1.0)) as api:
        tool = http_tool(unique("issue"), api.url("/coupons"), side_effects=True, timeout_s=0.2)
        outcome = run(call(tool.name, {"amount": 5}), tool)
        assert len(api.requests) == 1
    assert (outcome.status, outcome.attempts) == ("timeout", 1)


def test_an_unreachable_http_tool_is_a_failed_result():
    from tests.stack import free_port

    tool = http_tool(unique("get_order"), f"http://127.0.0.1:{free_port()}/orders", method="GET")
    outcome = run(call(tool.name, {"number": "SO-1"}), tool)
    assert (outcome.status, outcome.attempts) == ("failed", 2)
    assert (
        outcome.content
        == f"{FAILURE_MARKER} (status: failed): {tool.name} could not be reached: ConnectError"
    )


# circuit breaker -------------------------------------------------------------------------------


@override_settings(TOOL_BREAKER_THRESHOLD=2, TOOL_BREAKER_COOLDOWN_S=0.4)
def test_the_breaker_opens_fails_fast_then_a_trial_call_closes_it():
    token = unique("ledger")
    tool = token_tool(unique("ledger"), "tests.exec.flaky")
    FAILING.add(token)
    try:
        for _ in range(2):
            assert run(call(tool.name, {"token": token}), tool).status == "failed"
        assert CALLS[token] == 2
        assert tool_breaker().state(tool.name).state == "open"

        fast = run(call(tool.name, {"token": token}), tool)
        assert fast.status == "failed" and fast.attempts == 0
        assert fast.content == (
            f"{FAILURE_MARKER} (status: failed): {tool.name} is temporarily unavailable after repeated failures; "
            "continue without it or try later."
        )
        assert CALLS[token] == 2  # failed fast: the tool was not called
    finally:
        FAILING.discard(token)

    time.sleep(0.5)
    assert tool_breaker().state(tool.name).state == "half_open"
    trial = run(call(tool.name, {"token": token}), tool)
    assert trial.status == "success" and CALLS[token] == 3
    assert tool_breaker().state(tool.name).state == "closed"
    assert run(call(tool.name, {"token": token}), tool).status == "success"
    assert CALLS[token] == 4


@override_settings(TOOL_BREAKER_THRESHOLD=1, TOOL_BREAKER_COOLDOWN_S=0.3)
def test_a_failed_trial_opens_the_breaker_again_and_only_one_caller_gets_the_trial():
    token = unique("ledger")
    tool = token_tool(unique("ledger"), "tests.exec.flaky")
    FAILING.add(token)
    try:
        assert run(call(tool.name, {"token": token}), tool).status == "failed"
        time.sleep(0.4)
        invocations = [
            ToolInvocation(
                call_id=f"c{i}", name=tool.name, arguments={"token": token}, idempotency_key=f"k{i}"
            )
            for i in range(3)
        ]
        outcomes = on_loop(execute_all(invocations, {tool.name: tool}, "support"))
        assert CALLS[token] == 2  # one trial call among three
        assert sorted(o.attempts for o in outcomes) == [0, 0, 1]
        assert all("temporarily unavailable" in o.content for o in outcomes if o.attempts == 0)
        # The trial failed: open again, failing fast at once.
        assert tool_breaker().state(tool.name).state == "open"
        assert run(call(tool.name, {"token": token}), tool).attempts == 0
        assert CALLS[token] == 2
    finally:
        FAILING.discard(token)


@override_settings(TOOL_BREAKER_THRESHOLD=2, TOOL_BREAKER_COOLDOWN_S=0.3)
def test_a_business_error_during_the_trial_closes_the_breaker():
    with ScriptedApi(Answer(503, {"error": "down"})) as api:
        tool = http_tool(unique("get_order"), api.url("/orders/lookup"), method="GET")
        for _ in range(2):
            assert run(call(tool.name, {"number": "SO-1"}), tool).status == "failed"
        assert tool_breaker().state(tool.name).state == "open"
        assert run(call(tool.name, {"number": "SO-1"}), tool).attempts == 0
        requests_before = len(api.requests)

        time.sleep(0.4)
        api.default = Answer(404, {"ok": False, "error": "order SO-1 not found"})
        trial = run(call(tool.name, {"number": "SO-1"}), tool)
        assert trial.status == "failed" and "order SO-1 not found" in trial.content
        # The API answered: it is up, so the next call goes through at once.
        assert tool_breaker().state(tool.name).state == "closed"
        assert run(call(tool.name, {"number": "SO-1"}), tool).attempts == 1
        assert len(api.requests) == requests_before + 2


@override_settings(TOOL_BREAKER_THRESHOLD=2, TOOL_BREAKER_COOLDOWN_S=30)
def test_the_breaker_is_per_tool():
    token = unique("ledger")
    broken = token_tool(unique("broken"), "tests.exec.flaky")
    healthy = token_tool(unique("healthy"), "tests.exec.flaky")
    FAILING.add(token)
    try:
        for _ in range(2):
            run(call(broken.name, {"token": token}), broken)
    finally:
        FAILING.discard(token)
    assert run(call(broken.name, {"token": token}), broken).attempts == 0
    assert run(call(healthy.name, {"token": token}), healthy).status == "success"


# configured query strings, secret headers, failure log lines --------------------------------------


@pytest.mark.parametrize("method", ["GET", "DELETE"])
def test_a_get_or_delete_tool_keeps_its_configured_query_and_arguments_never_override_it(method):
    with ScriptedApi(Answer(200, {"ok": True})) as api:
        tool = http_tool(unique("lookup"), api.url("/lookup?fixed=1&number=SO-0"), method=method)
        outcome = run(call(tool.name, {"number": "SO-7", "amount": 3}), tool)
        (seen,) = api.requests
    assert outcome.status == "success"
    assert (seen.method, seen.path) == (method, "/lookup")
    # The URL's own parameters first and unchanged; the model's `number` is not sent twice.
    assert seen.raw_query == "fixed=1&number=SO-0&amount=3"


def test_a_probe_keeps_the_status_urls_configured_query():
    with ScriptedApi(Answer(200, {"status": "done", "result": {"ok": True}})) as api:
        tool = http_tool(
            unique("issue"), api.url("/coupons"), status_url=api.url("/coupons/status?v=2")
        )
        result = on_loop(execution.probe(tool, "k-1"))
        (seen,) = api.requests
    assert result.verdict == "done"
    assert (seen.path, seen.raw_query) == ("/coupons/status", "v=2&idempotency_key=k-1")


def test_a_header_naming_a_variable_outside_the_allow_list_is_refused_at_call_time(
    monkeypatch, caplog
):
    # A row edited in the admin's raw JSON, or written before the rule, must not leak either.
    monkeypatch.setenv("DATABASE_URL", "postgresql://app:db-password-123@db/app")
    with ScriptedApi(Answer(200, {"ok": True})) as api:
        tool = http_tool(
            unique("leaky"), api.url("/x"), headers={"X-Env-Leak": {"env": "DATABASE_URL"}}
        )
        with caplog.at_level("WARNING", logger="tools.execution"):
            outcome = run(call(tool.name, {"number": "1"}), tool)
        assert api.requests == []  # nothing was sent
    assert outcome.status == "failed"
    assert "is misconfigured" in outcome.error and "X-Env-Leak reads DATABASE_URL" in outcome.error
    assert "may read only names starting with TOOL_SECRET_" in outcome.error
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith(f"tool call failed: tool={tool.name} url={api.url('/x')} ")
    assert "status=misconfigured" in line
    assert "db-password-123" not in line + outcome.error + outcome.content


def test_an_allow_listed_variable_may_be_read_by_a_header(monkeypatch, settings):
    settings.TOOL_SECRET_ENV_ALLOW = ["ORDERS_TOKEN"]
    monkeypatch.setenv("ORDERS_TOKEN", "tok-42")
    with ScriptedApi(Answer(200, {"ok": True})) as api:
        tool = http_tool(unique("ok"), api.url("/x"), headers={"X-Token": {"env": "ORDERS_TOKEN"}})
        assert run(call(tool.name, {"number": "1"}), tool).status == "success"
        (seen,) = api.requests
    assert seen.headers["x-token"] == "tok-42"


def test_every_tool_failure_logs_one_line_with_tool_url_status_and_reason_never_the_key(
    monkeypatch, caplog
):
    secret = "tool-key-" + uuid.uuid4().hex
    monkeypatch.setenv("TOOL_SECRET_LOG_TEST", secret)
    headers = {"Authorization": {"env": "TOOL_SECRET_LOG_TEST"}}
    with ScriptedApi() as api:
        # The API echoes the key it was sent, in a 500 and in a 4xx refusal.
        api.script(
            Answer(500, {"error": f"bad key {secret}"}),
            Answer(422, {"error": f"refused for {secret}: amount too high"}),
        )
        broken = http_tool(unique("broken"), api.url("/b"), side_effects=True, headers=headers)
        refused = http_tool(unique("refused"), api.url("/r"), side_effects=True, headers=headers)
        slow = snapshot(unique("slow"), handler="tests.exec.sleepy", side_effects=True,
                        parameters={"type": "object"}, timeout_s=0.2)  # fmt: skip
        with caplog.at_level("WARNING", logger="tools.execution"):
            outcomes = [
                run(call(broken.name, {"amount": 1}), broken),
                run(call(refused.name, {"amount": 1}), refused),
                run(call(slow.name, {"seconds": 2}), slow),
                run(call(unique("nope"), {}), broken),  # the model's mistake, not a tool failure
            ]
    assert [o.status for o in outcomes] == ["failed", "failed", "timeout", "rejected"]
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3, lines
    assert lines[0].startswith(
        f"tool call failed: tool={broken.name} url={api.url('/b')} status=500 "
    )
    assert lines[1].startswith(
        f"tool call failed: tool={refused.name} url={api.url('/r')} status=422 "
    )
    assert "amount too high" in lines[1] and "[redacted]" in lines[1]
    assert lines[2] == (
        f"tool call failed: tool={slow.name} url=python:tests.exec.sleepy status=timeout "
        "reason=no answer within 0.2 s"
    )
    assert not [line for line in lines if secret in line]


def test_the_model_reads_the_result_description_with_the_tool_description():
    from engine.model.context import build_request
    from record.models import Agent

    described = snapshot(
        "lookup", description="Find an order.", result_description="The order's\nstatus."
    )
    plain = snapshot("echo", description="Echo the text")
    agent = Agent(slug="a", tools=["lookup", "echo"], rules=[])
    request = build_request(
        agent=agent, history=[], tools={"lookup": described, "echo": plain}, final=False
    )
    assert {t.name: t.description for t in request.tools} == {
        "echo": "Echo the text",
        "lookup": "Find an order. Returns: The order's status.",
    }
    assert snapshot("x", description="Look up", result_description="A row").model_description == (
        "Look up. Returns: A row"
    )


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_redirect_is_a_failed_result_not_a_success(status):
    with ScriptedApi(Answer(status, {"moved": "http://10.0.0.1/internal"})) as api:
        tool = http_tool(unique("get_order"), api.url("/orders/lookup"), method="GET")
        outcome = run(call(tool.name, {"number": "SO-9"}), tool)
        assert len(api.requests) == 1  # neither followed nor retried
    assert outcome.status == "failed" and outcome.attempts == 1
    assert f"HTTP {status}: the API answered with a redirect" in outcome.content
    assert "10.0.0.1" not in outcome.content
    assert tool_breaker().state(tool.name).failures == 0  # not an outage


# scrubbing -------------------------------------------------------------------------------------


def _leaked(outcome: Any) -> list[str]:
    seen = f"{outcome.error}\n{outcome.content}\n{outcome.output}"
    return [leak for leak in LEAKS if leak in seen]


@pytest.mark.parametrize(("status", "body"), [
    (422, {"ok": False, "error": f"rejected: {ECHOED}"}),
    (401, {"message": ECHOED, "echo": {"headers": {"x-user": ECHOED}}}),
    (400, f"<html>{ECHOED}</html>"),  # not JSON: its text is the body
])  # fmt: skip
def test_an_http_tools_error_body_is_scrubbed_before_anyone_sees_it(status, body):
    with ScriptedApi(Answer(status, body)) as api:
        tool = http_tool(unique("pay"), api.url("/pay"))
        outcome = run(call(tool.name, {"amount": 5}), tool)
    assert outcome.status == "failed"
    assert _leaked(outcome) == []
    assert "[redacted:email]" in outcome.content and "[redacted:card]" in outcome.content
    assert outcome.content.startswith(f"{FAILURE_MARKER} (status: failed): {tool.name} refused")


def test_a_handlers_exception_and_business_error_are_scrubbed():
    raising = snapshot(
        unique("raise"), handler="tests.exec.raises_echo", parameters={"type": "object"}
    )
    business = snapshot(
        unique("biz"), handler="tests.exec.business_echo", parameters={"type": "object"}
    )
    for tool in (raising, business):
        outcome = run(call(tool.name, {}), tool)
        assert outcome.status == "failed"
        assert _leaked(outcome) == [], outcome
        assert "password=[redacted:key]" in outcome.error
    # The business error's own fields stay readable, minus what was cut out.
    outcome = run(call(business.name, {}), business)
    assert outcome.output["ok"] is False and "[redacted:email]" in outcome.output["detail"]["who"]


def test_a_success_is_the_owners_data_and_stays_whole():
    tool = snapshot(unique("echo"))
    outcome = run(call(tool.name, {"text": ECHOED}), tool)
    assert outcome.status == "success" and outcome.output["echo"] == ECHOED


# retry policies (runtime/retry.py) -----------------------------------------------------------

FAST = RetryPolicy(attempts=3, backoff_base_s=0.01, backoff_max_s=0.02)


@pytest.fixture
def waits(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The executor's in-process waits, recorded and made instant (no timed test)."""
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    monkeypatch.setattr(execution.asyncio, "sleep", sleep)
    return slept


def test_a_read_only_tool_is_retried_by_its_policy_on_503_then_succeeds(waits):
    with ScriptedApi() as api:
        api.script(Answer(503, {"error": "busy"}), Answer(503, {"error": "busy"}), Answer(200))
        tool = http_tool(unique("lookup"), api.url("/x"), method="GET", retry=FAST)
        outcome = run(call(tool.name, {"number": "1"}), tool)
        assert len(api.requests) == 3
    assert (outcome.status, outcome.attempts) == ("success", 3)
    # Exponential backoff with jitter: 0.01 then 0.02 s, each times 0.5..1.
    assert len(waits) == 2 and 0.005 <= waits[0] <= 0.01 and 0.01 <= waits[1] <= 0.02


def test_the_attempts_are_a_bound_and_a_policy_can_leave_an_error_out(waits):
    with ScriptedApi(Answer(503, {"error": "busy"})) as api:
        tool = http_tool(unique("lookup"), api.url("/x"), method="GET", retry=FAST)
        outcome = run(call(tool.name, {"number": "1"}), tool)
        assert len(api.requests) == 3
    assert (outcome.status, outcome.attempts) == ("failed", 3)
    with ScriptedApi(Answer(503, {"error": "busy"})) as api:
        only_429 = RetryPolicy(attempts=3, on=frozenset({"429"}))
        tool = http_tool(unique("lookup"), api.url("/x"), method="GET", retry=only_429)
        assert run(call(tool.name, {"number": "1"}), tool).attempts == 1
        assert len(api.requests) == 1


def test_retry_after_in_seconds_and_as_an_http_date_is_the_wait(waits):
    when = email.utils.formatdate(time.time() + 1.5, usegmt=True)
    with ScriptedApi() as api:
        api.script(
            Answer(429, {"error": "slow down"}, headers={"Retry-After": "1"}),
            Answer(429, {"error": "slow down"}, headers={"Retry-After": when}),
            Answer(200),
        )
        tool = http_tool(unique("lookup"), api.url("/x"), method="GET", retry=FAST)
        outcome = run(call(tool.name, {"number": "1"}), tool)
        assert len(api.requests) == 3
    assert (outcome.status, outcome.attempts) == ("success", 3)
    assert waits[0] == 1.0 and 0 < waits[1] <= 1.5


def test_a_retry_after_beyond_the_cap_ends_the_retries(waits):
    with ScriptedApi(
        Answer(429, {"error": "come back tomorrow"}, headers={"Retry-After": "86400"})
    ) as api:
        tool = http_tool(unique("lookup"), api.url("/x"), method="GET", retry=FAST)
        outcome = run(call(tool.name, {"number": "1"}), tool)
        assert len(api.requests) == 1
    assert outcome.status == "failed" and "retry_in_s" not in outcome.extra and waits == []


def test_a_wait_too_long_for_the_worker_is_handed_to_the_tool_step(waits):
    with ScriptedApi(Answer(503, {"error": "busy"}, headers={"Retry-After": "30"})) as api:
        tool = http_tool(unique("lookup"), api.url("/x"), method="GET", retry=FAST)
        outcome = run(call(tool.name, {"number": "1"}), tool)
        assert len(api.requests) == 1
    assert outcome.status == "failed" and outcome.extra["retry_in_s"] == 30.0
    assert waits == []  # not slept in the worker
    # Attempts made in earlier steps count: the last one allowed is not retried again.
    with ScriptedApi(Answer(503, {"error": "busy"}, headers={"Retry-After": "30"})) as api:
        tool = http_tool(unique("lookup"), api.url("/x"), method="GET", retry=FAST)
        outcome = run(call(tool.name, {"number": "1"}, attempts_before=2), tool)
        assert len(api.requests) == 1
    assert "retry_in_s" not in outcome.extra


@pytest.mark.parametrize(
    ("answer", "retried"),
    [
        (Answer(429, {"error": "slow down"}, headers={"Retry-After": "0"}), True),
        (Answer(503, {"error": "down"}, headers={"Retry-After": "0"}), True),
        (Answer(503, {"error": "down"}), False),  # without Retry-After it may have run
        (Answer(500, {"error": "oops"}), False),
        (Drop(), False),  # sent, then the connection broke: it may have taken effect
    ],
)
def test_a_side_effecting_tool_is_retried_only_when_the_error_says_the_call_did_not_happen(
    waits, answer, retried
):
    with ScriptedApi() as api:
        api.script(answer, Answer(200, {"ok": True, "refunded": 5}))
        tool = http_tool(
            unique("refund"), api.url("/refunds"), side_effects=True, idempotent=True, retry=FAST
        )
        outcome = run(call(tool.name, {"number": "1", "amount": 5}), tool)
        seen = api.requests
    assert len(seen) == (2 if retried else 1)
    assert outcome.status == ("success" if retried else outcome.status)
    if retried:
        # The same idempotency key both times: the API can tell it is one call.
        assert seen[0].headers["idempotency-key"] == seen[1].headers["idempotency-key"]


def test_a_side_effecting_tool_is_retried_when_the_connection_was_never_made(waits):
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    tool = http_tool(
        unique("refund"), f"http://127.0.0.1:{port}/refunds", side_effects=True, retry=FAST
    )
    outcome = run(call(tool.name, {"number": "1", "amount": 5}), tool)
    assert (outcome.status, outcome.attempts) == ("failed", 3)
    assert len(waits) == 2
    # Without an idempotency key the API could not tell a repeat: never retried.
    unkeyed = ToolInvocation(
        call_id="c1", name=tool.name, arguments={"number": "1", "amount": 5}, idempotency_key=""
    )
    assert run(unkeyed, tool).attempts == 1


# egress (runtime/egress.py) -------------------------------------------------------------------


@override_settings(EGRESS_ALLOW=[])
def test_an_http_tool_at_a_refused_address_is_a_tool_error_naming_the_host_and_nothing_is_sent(
    caplog,
):
    with ScriptedApi() as api:
        # Read-only, so a connect error would be retried: a refusal is not.
        tool = http_tool(
            unique("internal"),
            api.url("/admin/keys?token=tok_0123456789abcdef"),
            method="GET",
            headers={"Authorization": "Bearer sk-internal-0123456789"},
        )
        with caplog.at_level("WARNING", logger="tools.execution"):
            outcome = run(call(tool.name, {"number": "SO-1"}), tool)
        assert api.requests == []
    assert (outcome.status, outcome.attempts) == ("failed", 1)
    assert outcome.output == {"ok": False, "error": "egress_refused", "host": "127.0.0.1"}
    assert outcome.content == (
        f"{FAILURE_MARKER} (status: failed): {tool.name} cannot be called: egress refused: "
        "127.0.0.1 is a loopback address that EGRESS_ALLOW does not list. Tell the user it is "
        "unavailable; calling it again will not help."
    )
    # What the model and the call's row get: the host, never the URL's path, query or headers.
    seen = f"{outcome.content} {outcome.error} {outcome.output}"
    assert "tok_0123456789abcdef" not in seen and "sk-internal" not in seen
    assert "/admin/keys" not in seen
    assert "status=egress_refused" in caplog.text
    assert tool_breaker().state(tool.name).failures == 0  # the policy, not an outage


@override_settings(EGRESS_ALLOW=[])
def test_a_probe_of_a_refused_status_url_cannot_tell_and_sends_nothing():
    from tools.execution import probe

    with ScriptedApi() as api:
        tool = http_tool(unique("coupon"), api.url("/c"), status_url=api.url("/c/status"))
        result = on_loop(probe(tool, "key-1"))
        assert api.requests == []
    assert result.verdict == "unknown"


@pytest.mark.django_db(transaction=True)
def test_a_turn_whose_tool_is_refused_goes_on_and_the_model_answers(
    make_agent, make_session, openai_server
):
    from engine.runner import loop as runner
    from record.models import Session, ToolCall
    from sessions.services import message_post
    from tests.fakes.model_servers import Call, Reply

    name = unique("metadata")
    ToolFactory(
        name=name,
        kind="http",
        handler="",
        url="http://169.254.169.254/latest/meta-data/iam/security-credentials/",
        method="GET",
        roles=[],
    )
    session = make_session(make_agent(tools=[name]))
    openai_server.script(
        Reply(calls=[Call(name, {}, id="call_1")]),
        Reply(text="That service is unavailable right now."),
    )
    message_post(session=session, content="What are the instance credentials?")
    # The model endpoint is on loopback (allowed here); the tool's metadata address is not.
    with override_settings(EGRESS_ALLOW=["127.0.0.1"]):
        result = runner.session_run(session_id=session.pk)
    assert result.stopped == "idle", result
    first, second = openai_server.requests
    assert second.last_tool_result() == (
        f"{FAILURE_MARKER} (status: failed): {name} cannot be called: egress refused: "
        "169.254.169.254 is a metadata address that EGRESS_ALLOW does not list. Tell the user "
        "it is unavailable; calling it again will not help."
    )
    [recorded] = ToolCall.objects.filter(session=session)
    assert recorded.status == "failed" and recorded.output["error"] == "egress_refused"
    assert Session.objects.get(pk=session.pk).state == "finished"
