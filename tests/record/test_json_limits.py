"""The one module that bounds caller JSON: depth, size, NUL, lone surrogates, numbers."""

import json
import sys

import pytest

from record.json_limits import JsonRejected, json_check, json_loads


def _rejected(value, **kwargs) -> JsonRejected:  # type: ignore[no-untyped-def]
    with pytest.raises(JsonRejected) as info:
        json_check(value, **kwargs)
    return info.value


def test_depth_counts_containers():
    json_check(1, max_depth=0)
    json_check({"a": [1]}, max_depth=2)
    error = _rejected({"a": [[1]]}, max_depth=2)
    assert (error.path, error.reason, error.limit) == ("$.a[0]", "nested deeper than 2 levels", 2)
    assert not error.too_large
    assert error.details == {"path": "$.a[0]", "reason": "nested deeper than 2 levels", "limit": 2}


def test_depth_defaults_to_the_setting(settings):
    settings.JSON_MAX_DEPTH = 3
    json_check([[[1]]])
    assert _rejected([[[[1]]]]).reason == "nested deeper than 3 levels"


def test_a_value_far_deeper_than_the_recursion_limit_is_checked_without_recursing():
    deep: list = []
    for _ in range(sys.getrecursionlimit() * 20):
        deep = [deep]
    assert _rejected(deep, max_depth=32).path == "$" + "[0]" * 32


@pytest.mark.parametrize(
    ("value", "path", "reason"),
    [
        ({"a": "x\x00"}, "$.a", "contains a NUL (\\u0000) character"),
        ({"a\x00": 1}, '$["a\\u0000"]', "key contains a NUL (\\u0000) character"),
        (
            ["ok", "\ud800"],
            "$[1]",
            "contains a lone surrogate (an unpaired \\ud800-\\udfff escape)",
        ),
        (
            {"\udfff": 1},
            '$["\\udfff"]',
            "key contains a lone surrogate (an unpaired \\ud800-\\udfff escape)",
        ),
        ({"n": float("inf")}, "$.n", "number is out of range (not a finite double)"),
        ({"n": float("nan")}, "$.n", "number is out of range (not a finite double)"),
        ({"n": 10**100}, "$.n", "number has more than 100 characters"),
        ({"s": {1, 2}}, "$.s", "set is not a JSON value"),
        ({1: "x"}, "$", "object key 1 is not a string"),
        ({"with space": {"x": b"1"}}, '$["with space"].x', "bytes is not a JSON value"),
    ],
)
def test_what_is_refused_and_where(value, path, reason):
    error = _rejected(value, max_depth=32)
    assert (error.path, error.reason) == (path, reason)
    assert error.message == f"{path}: {reason}"
    # Paths are printable ASCII, so an error can always be rendered and logged.
    assert error.path.isascii() and error.path.isprintable()


def test_nul_may_be_left_to_the_caller():
    json_check({"a": "x\x00"}, allow_nul=True, max_depth=32)


def test_a_long_key_is_shortened_in_the_path():
    key = "k-" * 100
    assert _rejected({key: "\ud800"}, max_depth=32).path == f'$["{key[:40]}..."]'


def test_the_root_names_the_value():
    assert _rejected({"a": "\ud800"}, root="$.metadata", max_depth=32).path == "$.metadata.a"


def test_size_is_the_compact_utf8_encoding():
    value = {"a": ["é", 1, None]}  # {"a":["é",1,null]}: 19 bytes
    json_check(value, max_bytes=19, max_depth=32)
    error = _rejected(value, max_bytes=18, max_depth=32)
    assert error.too_large and error.limit == 18
    assert (error.path, error.reason) == ("$", "is 19 bytes as compact JSON; the limit is 18")


def test_ordinary_json_passes():
    value = {"a": [1, 2.5, -3e-10, True, False, None, "text ünïcode \U0001f600"], "b": {}}
    json_check(value, max_bytes=1000, max_depth=32)


# decoding -------------------------------------------------------------------------------


def test_json_loads_decodes_within_bounds():
    assert json_loads('{"a": [1, 2.5, "\\ud83d\\ude00", "nul \\u0000"]}', max_depth=2) == {
        "a": [1, 2.5, "\U0001f600", "nul \x00"]
    }


@pytest.mark.parametrize("depth", [33, 2_000, 200_000])
def test_json_loads_refuses_deep_text_without_a_recursion_error(depth):
    with pytest.raises(JsonRejected) as info:
        json_loads("[" * depth + "]" * depth, max_depth=32)
    assert info.value.reason == "nested deeper than 32 levels"


@pytest.mark.parametrize(
    ("text", "path", "reason"),
    [
        ('{"n": 1e400}', "$.n", "number is out of range (not a finite double)"),
        ("[-1e400]", "$[0]", "number is out of range (not a finite double)"),
        ('{"n": ' + "1" * 101 + "}", "$.n", "number has more than 100 characters"),
        ('{"n": ' + "1" * 99 + ".5}", "$.n", "number has more than 100 characters"),
        ('["\\ud800"]', "$[0]", "contains a lone surrogate (an unpaired \\ud800-\\udfff escape)"),
    ],
)
def test_json_loads_says_where_a_bound_is_broken(text, path, reason):
    with pytest.raises(JsonRejected) as info:
        json_loads(text, max_depth=32)
    assert (info.value.path, info.value.reason) == (path, reason)


def test_a_number_of_exactly_the_limit_is_kept():
    assert json_loads("1" * 100, max_depth=32) == int("1" * 100)


@pytest.mark.parametrize("text", ["NaN", "[Infinity]", '{"a": -Infinity}', "{", "nope", ""])
def test_text_that_is_not_json_is_a_plain_value_error(text):
    with pytest.raises(ValueError) as info:
        json_loads(text, max_depth=32)
    assert not isinstance(info.value, JsonRejected)


def test_rejections_are_json_serialisable():
    with pytest.raises(JsonRejected) as info:
        json_loads('{"\\ud800": 1}', max_depth=32)
    assert json.loads(json.dumps(info.value.details))["path"] == '$["\\ud800"]'
