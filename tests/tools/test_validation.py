"""Checking the model's tool arguments: safe coercions recorded, every problem said plainly, at once."""

import json

import pytest

from tools.validation import MAX_ARGUMENT_BYTES, check_arguments, compile_validator

SCHEMA = {
    "type": "object",
    "properties": {
        "days": {"type": "integer", "minimum": 1, "maximum": 90},
        "amount": {"type": "number", "exclusiveMinimum": 0},
        "order_number": {"type": "string"},
        "customer_ids": {"type": "array", "items": {"type": "integer"}},
        "status": {"enum": ["exception", "ok"]},
        "end_date": {"type": "string", "format": "date"},
        "at": {"type": "string", "format": "date-time"},
        "email": {"type": "string", "format": "email"},
        "urgent": {"type": "boolean"},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
        "note": {"type": "string", "maxLength": 5},
        "code": {"type": "string", "pattern": "^SO-[0-9]+$"},
        "title": {"type": "string", "minLength": 1},
        "lines": {"type": "array", "minItems": 1},
    },
    "required": ["days"],
    "additionalProperties": False,
}

VALIDATOR = compile_validator(SCHEMA)


def check(arguments):  # type: ignore[no-untyped-def]
    return check_arguments(VALIDATOR, arguments)


# safe coercions --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "coerced", "note"),
    [
        ({"days": "42"}, {"days": 42}, 'days: "42" -> 42'),
        ({"days": " 7 "}, {"days": 7}, 'days: " 7 " -> 7'),
        ({"days": "-3"}, {"days": -3}, None),  # coerced, then refused by minimum
        ({"days": 1, "amount": "12.5"}, {"days": 1, "amount": 12.5}, 'amount: "12.5" -> 12.5'),
        ({"days": 1, "amount": "10"}, {"days": 1, "amount": 10}, 'amount: "10" -> 10'),
        ({"days": 1, "order_number": 1001}, {"days": 1, "order_number": "1001"}, 'order_number: 1001 -> "1001"'),
        ({"days": 1, "order_number": 2.5}, {"days": 1, "order_number": "2.5"}, 'order_number: 2.5 -> "2.5"'),
        ({"days": 1, "customer_ids": 7}, {"days": 1, "customer_ids": [7]}, "customer_ids: single value -> one-element array"),
        ({"days": 1, "address": {"city": "Oslo", "zip": 150}}, {"days": 1, "address": {"city": "Oslo", "zip": "150"}}, 'address.zip: 150 -> "150"'),
    ],
)  # fmt: skip
def test_each_safe_coercion_is_applied_and_recorded(arguments, coerced, note):
    result = check(arguments)
    assert result.arguments == coerced
    if note is not None:
        assert result.coercions == [note]
        assert result.errors == []


def test_coercions_inside_an_array_are_recorded_per_item():
    result = check({"days": "5", "customer_ids": ["1", 2, "3"]})
    assert result.errors == []
    assert result.arguments == {"days": 5, "customer_ids": [1, 2, 3]}
    assert result.coercions == [
        'days: "5" -> 5',
        'customer_ids[0]: "1" -> 1',
        'customer_ids[2]: "3" -> 3',
    ]


def test_a_single_value_becomes_an_array_and_its_item_is_coerced_too():
    result = check({"days": 1, "customer_ids": "9"})
    assert result.arguments["customer_ids"] == [9]
    assert result.coercions == [
        "customer_ids: single value -> one-element array",
        'customer_ids[0]: "9" -> 9',
    ]


@pytest.mark.parametrize(
    "arguments",
    [
        {"days": "seven"},  # not a number
        {"days": "4.5"},  # not an integer
        {"days": True},  # a boolean is not a number, and is not turned into one
        {"days": 1, "urgent": "yes"},  # no guessing at booleans
        {"days": 1, "order_number": True},  # a boolean is not turned into a string
        {"days": 1, "amount": "1e400"},  # would be infinity: not JSON
        {"days": 1, "amount": "12,5"},
    ],
)
def test_unsafe_values_are_not_coerced(arguments):
    result = check(arguments)
    assert result.errors, result
    assert result.coercions == []


def test_valid_arguments_pass_unchanged_with_no_coercions():
    arguments = {
        "days": 7,
        "amount": 9.5,
        "order_number": "SO-1",
        "customer_ids": [1, 2],
        "status": "ok",
        "end_date": "2025-01-15",
        "at": "2025-01-15T10:00:00Z",
        "email": "ada@example.com",
        "urgent": False,
        "address": {"city": "Oslo"},
    }
    result = check(arguments)
    assert (result.arguments, result.coercions, result.errors) == (arguments, [], [])


# what is still wrong, said the way a person fixes it --------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({}, "days is required but missing"),
        ({"days": 1, "address": {}}, "address.city is required but missing"),
        ({"days": "seven"}, 'days must be an integer; got "seven"'),
        ({"days": 1, "urgent": "yes"}, 'urgent must be true or false; got "yes"'),
        ({"days": 1, "customer_ids": ["x"]}, 'customer_ids[0] must be an integer; got "x"'),
        ({"days": 1, "address": "Oslo"}, 'address must be an object; got "Oslo"'),
        ({"days": 1, "end_date": "2025/1/15"}, 'end_date must be a date in YYYY-MM-DD format; got "2025/1/15"'),
        ({"days": 1, "at": "yesterday"}, 'at must be a date and time in ISO 8601 format (YYYY-MM-DDTHH:MM:SSZ); got "yesterday"'),
        ({"days": 1, "email": "nobody"}, 'email must be an email address; got "nobody"'),
        ({"days": 1, "status": "late"}, 'status must be one of "exception", "ok"; got "late"'),
        ({"days": 1, "colour": "red", "size": 2}, "unexpected field(s) colour, size in arguments; allowed: address, amount, at, code, customer_ids, days, email, end_date, lines, note, order_number, status, title, urgent"),
        ({"days": 1, "address": {"city": "Oslo", "street": "x"}}, "unexpected field(s) street in address; allowed: city, zip"),
        ({"days": 0}, "days must be at least 1; got 0"),
        ({"days": 91}, "days must be at most 90; got 91"),
        ({"days": 1, "note": "too long"}, "note must have at most 5 characters; got 8"),
        ({"days": 1, "note": "x" * 5000}, "note must have at most 5 characters; got 5000"),
        ({"days": 1, "code": "1001"}, 'code must match the pattern ^SO-[0-9]+$; got "1001"'),
        ({"days": 1, "title": ""}, "title must have at least 1 characters; got 0"),
        ({"days": 1, "lines": []}, "lines must have at least 1 items; got 0"),
        ({"days": 1, "amount": 0}, "amount must be greater than 0; got 0"),
    ],
)  # fmt: skip
def test_every_error_kind_has_a_precise_message(arguments, message):
    result = check(arguments)
    assert result.errors == [message]


def test_every_wrong_field_is_listed_at_once():
    result = check(
        {
            "days": "seven",
            "end_date": "2025/1/15",
            "status": "late",
            "urgent": "yes",
            "colour": "red",
            "order_number": 12,
        }
    )
    assert result.errors == [
        "unexpected field(s) colour in arguments; allowed: address, amount, at, code, customer_ids, days, email, end_date, lines, note, order_number, status, title, urgent",
        'days must be an integer; got "seven"',
        'end_date must be a date in YYYY-MM-DD format; got "2025/1/15"',
        'status must be one of "exception", "ok"; got "late"',
        'urgent must be true or false; got "yes"',
    ]
    # The safe part was still coerced (and recorded), so the model only fixes the rest.
    assert result.coercions == ['order_number: 12 -> "12"']


def test_a_long_wrong_value_is_shown_shortened():
    result = check({"days": "x" * 500})
    (message,) = result.errors
    assert message == 'days must be an integer; got "' + "x" * 76 + "..."


@pytest.mark.parametrize(
    ("arguments", "kind"),
    [([1, 2], "list"), ("days=7", "str"), (7, "int"), (None, "NoneType")],
)
def test_arguments_that_are_not_an_object_are_refused(arguments, kind):
    result = check(arguments)
    assert result.errors == [f"arguments must be a JSON object; got {kind}"]
    assert result.arguments == {} and result.coercions == []


def test_huge_arguments_are_refused_before_any_checking():
    arguments = {"days": 1, "note": "x" * MAX_ARGUMENT_BYTES}
    size = len(json.dumps(arguments).encode())
    result = check(arguments)
    assert result.errors == [
        f"arguments are {size} bytes; the limit is {MAX_ARGUMENT_BYTES}. Send less data."
    ]
    assert result.arguments == {} and result.coercions == []


def test_the_size_limit_counts_bytes_not_characters():
    # 3 bytes per character in UTF-8: under the limit in characters, over it in bytes.
    text = "€" * (MAX_ARGUMENT_BYTES // 2)
    result = check({"days": 1, "note": text})
    assert result.errors and result.errors[0].startswith("arguments are ")
    assert "the limit is" in result.errors[0]


def test_arguments_just_under_the_limit_are_checked_normally():
    filler = "x" * (MAX_ARGUMENT_BYTES - 100)
    result = check({"days": 1, "order_number": filler})
    assert result.errors == []
    assert result.arguments == {"days": 1, "order_number": filler}


def test_a_validator_is_reusable_and_keeps_no_state_between_checks():
    assert check({"days": "seven"}).errors
    assert check({"days": 3}).errors == []
    assert check({"days": "seven"}).errors == ['days must be an integer; got "seven"']
