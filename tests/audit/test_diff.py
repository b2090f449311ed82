from audit.diff import ABSENT, changes, flatten


def test_nested_objects_are_compared_key_by_key_and_lists_whole():
    assert flatten({"a": {"b": {"c": 1}}, "l": [1, {"x": 2}]}) == {"a.b.c": 1, "l": [1, {"x": 2}]}
    before, after = changes(
        {"name": "refund", "parameters": {"properties": {"amount": {"maximum": 100}}}, "roles": ["a"]},
        {"name": "refund", "parameters": {"properties": {"amount": {"maximum": 50}}}, "roles": ["a", "b"]},
    )  # fmt: skip
    assert before == {"parameters.properties.amount.maximum": 100, "roles": ["a"]}
    assert after == {"parameters.properties.amount.maximum": 50, "roles": ["a", "b"]}
    # Deeper than DEPTH levels, the rest is compared whole.
    deep = {"a": {"b": {"c": {"d": {"e": {"f": {"g": 1}}}}}}}
    assert flatten(deep) == {"a.b.c.d.e.f": {"g": 1}}


def test_a_path_on_one_side_only_is_absent_on_the_other():
    before, after = changes({"a": 1}, {"b": 2})
    assert before == {"a": 1, "b": ABSENT} and after == {"a": ABSENT, "b": 2}
    assert changes(None, {"x": 1}) == ({"x": ABSENT}, {"x": 1})
    assert changes({"x": 1}, {"x": 1}) == ({}, {})
