"""The price of a model call: tokens at the endpoint's prices per 1,000, exact to the last digit."""

from decimal import Decimal

import pytest

from billing.pricing import model_call_cost


def test_input_and_output_tokens_are_priced_apart_per_thousand():
    cost = model_call_cost(
        input_tokens=1000,
        output_tokens=500,
        price_input_per_1k=Decimal("0.15"),
        price_output_per_1k=Decimal("0.60"),
    )
    assert cost == Decimal("0.45")


def test_a_free_endpoint_costs_nothing_whatever_the_tokens():
    cost = model_call_cost(
        input_tokens=123_456,
        output_tokens=7_890,
        price_input_per_1k=Decimal("0"),
        price_output_per_1k=Decimal("0"),
    )
    assert cost == 0


def test_no_tokens_cost_nothing():
    assert model_call_cost(
        input_tokens=0,
        output_tokens=0,
        price_input_per_1k=Decimal("3"),
        price_output_per_1k=Decimal("15"),
    ) == Decimal("0")


@pytest.mark.parametrize(
    ("input_tokens", "output_tokens", "expected"),
    [
        (1, 0, Decimal("0.000003")),
        (0, 1, Decimal("0.000015")),
        (7, 3, Decimal("0.000066")),
    ],
)
def test_single_tokens_keep_their_exact_fraction(input_tokens, output_tokens, expected):
    cost = model_call_cost(
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        price_input_per_1k=Decimal("0.003"),
        price_output_per_1k=Decimal("0.015"),
    )
    assert cost == expected
    assert isinstance(cost, Decimal)


def test_many_calls_add_up_to_the_price_of_their_total():
    prices = {"price_input_per_1k": Decimal("0.07"), "price_output_per_1k": Decimal("0.21")}
    calls = [(311, 29), (1_024, 0), (5, 977)]
    parts = sum(
        (model_call_cost(input_tokens=i, output_tokens=o, **prices) for i, o in calls), Decimal(0)
    )
    whole = model_call_cost(
        input_tokens=sum(i for i, _ in calls), output_tokens=sum(o for _, o in calls), **prices
    )
    assert parts == whole
