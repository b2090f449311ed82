"""A tool step's credit pool request: its estimates from the tools' `value` and `cost`, and
what becomes of an estimate that cannot be used (hostile or failing expressions)."""

import pytest

from billing.models import CreditPool, PoolRequest
from engine.gates.credit_pool import pool_ask, pool_gate
from record.models import ToolCall
from tests.factories import ToolFactory
from tools.execution import tools_for_agent

pytestmark = pytest.mark.django_db


def _calls(session, *inputs, tool="coupon"):  # type: ignore[no-untyped-def]
    return [
        ToolCall.objects.create(
            session=session,
            turn=1,
            step=1,
            position=n,
            call_id=f"c{n}",
            tool_name=tool,
            input=arguments,
            idempotency_key=f"{session.pk}:1:1:{n}",
        )  # fmt: skip
        for n, arguments in enumerate(inputs)
    ]


def _ask(session, *inputs, **tool_fields):  # type: ignore[no-untyped-def]
    ToolFactory(name="coupon", **tool_fields)
    return pool_ask(session, _calls(session, *inputs), tools_for_agent(["coupon"]))


def test_a_free_tool_asks_nothing(make_session) -> None:  # type: ignore[no-untyped-def]
    assert _ask(make_session(), {"amount": 5}) is None


def test_the_estimates_are_the_tools_expressions_over_args_and_session(make_session) -> None:  # type: ignore[no-untyped-def]
    session = make_session(value=2.0)
    ask = _ask(
        session,
        {"amount": 50},
        {"amount": 10},
        value="double(args.amount) * session.value",
        cost="double(args.amount) / 4.0",
        credit_cost=1,
    )
    assert (ask.value, ask.cost, ask.note) == (120.0, 13 + 3, "")  # 12.5 -> 13, 2.5 -> 3
    assert (ask.action, ask.key) == ("coupon", f"pool:{session.pk}:1:1:0")


def test_no_expressions_ask_the_sessions_value_at_the_credit_cost(make_session) -> None:  # type: ignore[no-untyped-def]
    ask = _ask(make_session(value=3.0), {}, credit_cost=7)
    assert (ask.value, ask.cost) == (3.0, 7)


@pytest.mark.parametrize(
    ("expression", "why"),
    [
        ("-5.0", "not a non-negative number"),
        ("0.0 / 0.0", "JSON cannot hold"),  # NaN
        ("1e300 * 1e300", "JSON cannot hold"),  # infinity
        ("1e15", "more than 1e+12"),
        ("'a lot'", "not a number"),
        ("true", "not a number"),
        ("args.missing * 2.0", "failed"),
        ("double(args.amount) + 1", "failed"),  # double + int: fails at run time
    ],
)
def test_a_value_that_cannot_be_used_is_the_sessions_and_says_why(
    make_session, expression, why
) -> None:  # type: ignore[no-untyped-def]
    session = make_session(value=4.0)
    ask = _ask(session, {"amount": 1}, value=expression, credit_cost=2)
    assert ask.value == 4.0
    assert ask.note.startswith("coupon.value: ") and why in ask.note
    assert "the session's value 4 is used" in ask.note


@pytest.mark.parametrize("expression", ["0.0", "-1.0", "1e13", "args.nope", "'x'"])
def test_a_cost_that_cannot_be_used_is_the_credit_cost_and_says_why(
    make_session, expression
) -> None:  # type: ignore[no-untyped-def]
    ask = _ask(make_session(), {}, cost=expression, credit_cost=0)
    assert ask.cost == 1  # no credit_cost: one point, never free of the pool
    assert ask.note.startswith("coupon.cost: ")


def test_the_failure_is_on_the_request_the_admin_shows(make_session) -> None:  # type: ignore[no-untyped-def]
    CreditPool.objects.create(name="global", size=10)
    session = make_session(value=1.5)
    ToolFactory(name="coupon", value="args.missing", credit_cost=2)
    gate = pool_gate(session, _calls(session, {}), tools_for_agent(["coupon"]))
    assert gate.intent is not None and gate.intent.granted
    request = PoolRequest.objects.get()
    assert (request.value, request.cost, request.roi) == (1.5, 2, 0.75)
    assert "coupon.value:" in request.note


def test_a_cost_larger_than_the_pool_refuses_the_calls_with_insufficient_credits(
    make_session,
) -> None:  # type: ignore[no-untyped-def]
    CreditPool.objects.create(name="global", size=10)
    session = make_session()
    ToolFactory(name="coupon", credit_cost=11)
    calls = _calls(session, {})
    gate = pool_gate(session, calls, tools_for_agent(["coupon"]))
    refusal = gate.settled[calls[0].pk]
    assert refusal.output == {
        "code": "insufficient_credits",
        "points_needed": 11,
        "points_left": 10,
    }
    assert "more than the credit pool holds (10)" in refusal.error
