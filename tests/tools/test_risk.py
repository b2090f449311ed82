"""Risk levels of tool calls: declared, or assessed from the tool and the arguments."""

import dataclasses

import pytest

from tools.execution import ToolSnapshot
from tools.risk import FailureCount, assess_risk, money_arguments


def _tool(**fields: object) -> ToolSnapshot:
    base = ToolSnapshot(
        name="t", description="", parameters={"type": "object"}, kind="python", handler="h",
        url="", method="POST", headers={}, timeout_s=1.0, side_effects=False, roles=(), version="v",
    )  # fmt: skip
    return dataclasses.replace(base, **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("fields", "arguments", "level", "why"),
    [
        ({}, {"amount": 5}, 0, "read-only"),
        ({"side_effects": True}, {"note": "hi"}, 1, "side effect"),
        ({"side_effects": True, "kind": "http", "method": "GET"}, {}, 1, "side effect"),
        ({"side_effects": True, "kind": "http", "method": "delete"}, {}, 2, "side effect via DELETE"),
        ({"side_effects": True}, {"order": {"refund_amount": 3}}, 2, "side effect with money-like order.refund_amount"),
        ({"side_effects": True}, {"note": "12.50 EUR"}, 2, "side effect with money-like note"),
        ({"side_effects": True, "kind": "http", "method": "POST"}, {"price": 1}, 2, "side effect via POST, money-like price"),
        ({"side_effects": True, "risk_level": 0}, {"amount": 5}, 0, "declared by t"),
        ({"risk_level": 3}, {}, 3, "declared by t"),
    ],
)  # fmt: skip
def test_levels(fields, arguments, level, why):
    risk = assess_risk(_tool(**fields), arguments)
    assert (risk.level, risk.why) == (level, why)


def test_a_tool_that_failed_often_lately_goes_up_one_level_but_not_past_three():
    often = FailureCount(failed=3, total=5)
    assert assess_risk(_tool(), {}, often).level == 1
    money = assess_risk(_tool(side_effects=True), {"amount": 1}, often)
    assert money.level == 3 and "3 of its last 5 calls failed" in money.why
    # Too few calls to judge, or a low rate: no change.
    assert assess_risk(_tool(), {}, FailureCount(failed=2, total=2)).level == 0
    assert assess_risk(_tool(), {}, FailureCount(failed=1, total=10)).level == 0
    # A declared level is not second-guessed.
    assert assess_risk(_tool(risk_level=1), {}, often).level == 1


def test_money_arguments_walks_nested_values():
    assert money_arguments({"items": [{"sku": "a", "price": 3}], "note": "$4"}) == [
        "items[0].price",
        "note",
    ]
    assert money_arguments({"payment": {"method": "card"}, "discount": None}) == ["payment"]
