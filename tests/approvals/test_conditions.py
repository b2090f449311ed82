"""approval_when: validated as data, evaluated without eval."""

import pytest

from approvals.conditions import ConditionError, evaluate, validate

ARGS = {
    "amount": 80,
    "currency": "EUR",
    "customer": {"tier": "new", "tags": ["vip"]},
    "items": [{"sku": "A"}],
}


@pytest.mark.parametrize(
    ("condition", "expected"),
    [
        ({"field": "amount", "op": "gt", "value": 50}, True),
        ({"field": "amount", "op": ">", "value": 80}, False),
        ({"field": "amount", "op": "gte", "value": 80}, True),
        ({"field": "amount", "op": "lt", "value": 100}, True),
        ({"field": "amount", "op": "lte", "value": 79.5}, False),
        ({"field": "currency", "op": "eq", "value": "EUR"}, True),
        ({"field": "currency", "op": "ne", "value": "EUR"}, False),
        ({"field": "currency", "op": "in", "value": ["USD", "EUR"]}, True),
        ({"field": "currency", "op": "not_in", "value": ["USD"]}, True),
        ({"field": "customer.tier", "op": "eq", "value": "new"}, True),
        ({"field": "customer.tags", "op": "contains", "value": "vip"}, True),
        ({"field": "currency", "op": "contains", "value": "U"}, True),
        ({"field": "items.0.sku", "op": "eq", "value": "A"}, True),
        ({"field": "items.5.sku", "op": "eq", "value": "A"}, False),
        ({"field": "customer.tier", "op": "exists"}, True),
        ({"field": "customer.age", "op": "exists", "value": False}, True),
        # Missing fields and unlike types are simply not true, never an error.
        ({"field": "missing", "op": "gt", "value": 1}, False),
        ({"field": "currency", "op": "gt", "value": 5}, False),
        ({"field": "amount", "op": "eq", "value": True}, False),
        ({"all": [{"field": "amount", "op": "gt", "value": 50}, {"field": "currency", "op": "eq", "value": "EUR"}]}, True),
        ({"all": [{"field": "amount", "op": "gt", "value": 50}, {"field": "currency", "op": "eq", "value": "USD"}]}, False),
        ({"any": [{"field": "amount", "op": "gt", "value": 500},
                  {"all": [{"field": "customer.tier", "op": "eq", "value": "new"},
                           {"field": "amount", "op": "gt", "value": 50}]}]}, True),
        (None, False),
        ({}, False),
    ],
)  # fmt: skip
def test_evaluate(condition, expected):
    validate(condition)
    assert evaluate(condition, ARGS) is expected


@pytest.mark.parametrize(
    ("condition", "path"),
    [
        ([1], ""),
        ({"field": "amount", "op": "between", "value": 1}, "op"),
        ({"field": "", "op": "eq", "value": 1}, "field"),
        ({"field": "a..b", "op": "eq", "value": 1}, "field"),
        ({"field": "amount", "op": "gt"}, "value"),
        ({"field": "amount", "op": "in", "value": 3}, "value"),
        ({"field": "amount", "op": "gt", "value": [1]}, "value"),
        ({"field": "amount", "op": "exists", "value": "yes"}, "value"),
        ({"field": "amount", "op": "eq", "value": 1, "extra": 1}, ""),
        ({"all": []}, "all"),
        ({"any": [{"field": "amount", "op": "gt", "value": 1}, {"field": "x", "op": "??", "value": 1}]}, "any[1].op"),
        ({"all": [{"field": "a", "op": "eq", "value": 1}], "any": []}, ""),
        ({"__import__": "os"}, ""),
    ],
)  # fmt: skip
def test_validate_names_the_wrong_part(condition, path):
    with pytest.raises(ConditionError) as error:
        validate(condition)
    assert error.value.path.rstrip(".") == path


def test_too_deep_is_refused():
    condition: dict = {"field": "a", "op": "eq", "value": 1}
    for _ in range(12):
        condition = {"all": [condition]}
    with pytest.raises(ConditionError):
        validate(condition)
