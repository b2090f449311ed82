"""Prechecks of a tool (tools/prechecks.py): a registered Python check, an HTTP check on
127.0.0.1, and what a check that cannot answer reports; the config file declares them."""

import asyncio
from typing import Any

import pytest

from configuration.services import ConfigInvalid, config_apply
from runtime import io_loop
from tests.tools.http_server import Answer, ScriptedApi
from tools.execution import ToolSnapshot
from tools.models import Tool
from tools.prechecks import precheck, prechecks_run
from tools.registry import tool_handler

UNPAID = {"A-1"}


@tool_handler("tests.prechecks.order_unpaid")
def _order_unpaid(order_id: str) -> str | None:
    return None if order_id in UNPAID else f"order {order_id} is not open for payment"


@tool_handler("tests.prechecks.async_check")
async def _async_check(order_id: str) -> dict[str, Any]:
    await asyncio.sleep(0)
    return {"ok": order_id == "A-1", "reason": "checked asynchronously"}


@tool_handler("tests.prechecks.slow")
def _slow(order_id: str) -> bool:
    import time

    time.sleep(1)
    return True


@tool_handler("tests.prechecks.broken")
def _broken(order_id: str) -> bool:
    raise ConnectionError("ledger down")


def _tool(**fields: Any) -> ToolSnapshot:
    base: dict[str, Any] = {
        "name": "pay_order", "description": "Pay.", "parameters": {"type": "object"},
        "kind": "python", "handler": "builtin.current_time", "url": "", "method": "POST",
        "headers": {}, "timeout_s": 0.5, "side_effects": True, "roles": (), "version": "1",
    }  # fmt: skip
    return ToolSnapshot(**{**base, **fields})


@pytest.mark.parametrize(
    ("handler", "order", "holds", "reason"),
    [
        ("tests.prechecks.order_unpaid", "A-1", True, ""),
        ("tests.prechecks.order_unpaid", "B-9", False, "order B-9 is not open for payment"),
        ("tests.prechecks.async_check", "B-9", False, "checked asynchronously"),
        ("tests.prechecks.slow", "A-1", None, "the check failed (TimeoutError)"),
        ("tests.prechecks.broken", "A-1", None, "the check failed (ConnectionError)"),
    ],
)
def test_a_python_check_says_whether_the_precondition_holds(
    handler: str, order: str, holds: bool | None, reason: str
) -> None:
    result = io_loop.run(precheck(_tool(precheck_handler=handler), {"order_id": order}))
    assert (result.holds, result.reason) == (holds, reason)


def test_an_http_check_gets_the_arguments_and_the_tools_headers() -> None:
    with ScriptedApi() as api:
        api.script(
            Answer(200, {"ok": True}),
            Answer(200, {"ok": False, "reason": "order A-1 was cancelled"}),
            Answer(500, {"error": "boom"}),
            Answer(200, {"verdict": "fine"}),
        )
        tool = _tool(kind="http", precheck_url=api.url("/precheck"), headers={"X-Tenant": "t1"})
        results = io_loop.run(prechecks_run([(tool, {"order_id": "A-1"})] * 4))
        seen = api.requests
    assert sorted((r.holds, r.reason) for r in results if r.holds is not None) == [
        (False, "order A-1 was cancelled"),
        (True, ""),
    ]
    unsure = sorted(r.reason for r in results if r.holds is None)
    assert unsure == [
        "the check answered HTTP 200 without a verdict",
        "the check answered HTTP 500 without a verdict",
    ]
    assert all(s.body == {"tool": "pay_order", "arguments": {"order_id": "A-1"}} for s in seen)
    assert all(s.headers["x-tenant"] == "t1" for s in seen)


def test_a_checks_reason_is_scrubbed_before_it_reaches_the_models_note() -> None:
    echoed = "order A-1 was refunded to jane.roe@example.org, card 4242 4242 4242 4242"
    with ScriptedApi(Answer(200, {"ok": False, "reason": echoed})) as api:
        tool = _tool(kind="http", precheck_url=api.url("/precheck"))
        result = io_loop.run(precheck(tool, {"order_id": "A-1"}))
    assert result.holds is False
    assert result.reason == "order A-1 was refunded to [redacted:email], card [redacted:card]"


@pytest.mark.django_db
def test_the_config_file_declares_a_precheck_and_names_a_wrong_handler() -> None:
    tool = {
        "name": "pay_order", "description": "Pay an order.", "kind": "http",
        "url": "http://127.0.0.1:9/pay", "precheck_url": "http://127.0.0.1:9/pay/precheck",
        "parameters": {"type": "object", "properties": {}},
    }  # fmt: skip
    config_apply(document={"tools": [tool]})
    assert Tool.objects.get(name="pay_order").precheck_url == "http://127.0.0.1:9/pay/precheck"
    assert ToolSnapshot.from_model(Tool.objects.get()).precheck_url.endswith("/pay/precheck")
    with pytest.raises(ConfigInvalid) as error:
        config_apply(document={"tools": [{**tool, "precheck_handler": "no.such.check"}]})
    assert "tools[0] (pay_order).precheck_handler: no registered Python handler" in str(error.value)
