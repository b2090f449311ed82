"""Tool results as compact text for the model: key facts first, counts, a failure marker, a cap."""

from tools.rendering import (
    FAILURE_MARKER,
    MAX_CHARS,
    MAX_ITEMS,
    MAX_VALUE_CHARS,
    cap,
    render_failure,
    render_success,
)


def test_scalars_come_first_on_one_line_then_lists_with_counts():
    output = {
        "orders": [
            {"order_number": "SO-1001", "customer_name": "Ada", "exception": "held at customs"},
            {"order_number": "SO-1002", "customer_name": "Grace", "exception": "lost"},
        ],
        "count": 2,
        "days": 7,
        "logistics_status": "exception",
    }
    assert render_success(output) == (
        "count: 2, days: 7, logistics_status: exception\n"
        "orders: 2 items\n"
        "- order_number: SO-1001; customer_name: Ada; exception: held at customs\n"
        "- order_number: SO-1002; customer_name: Grace; exception: lost"
    )


def test_it_is_not_json():
    text = render_success(
        {"ok": True, "coupon_code": "CPN-1", "amount": "10.00", "duplicate": False}
    )
    assert text == "ok: true, coupon_code: CPN-1, amount: 10.00, duplicate: false"
    assert "{" not in text and '"' not in text


def test_one_item_is_singular_and_an_empty_list_says_zero():
    assert render_success({"rows": [1]}) == "rows: 1 item\n- 1"
    assert render_success({"rows": []}) == "rows: 0 items"


def test_null_and_numbers_are_compact_json_and_nested_objects_one_line():
    text = render_success(
        {"missing": None, "ratio": 0.5, "customer": {"id": 3, "tags": ["a", "b"]}}
    )
    assert text == 'missing: null, ratio: 0.5\ncustomer: id: 3; tags: ["a","b"]'


def test_long_lists_show_the_first_items_and_say_how_many_more():
    text = render_success({"ids": list(range(MAX_ITEMS + 7))})
    lines = text.splitlines()
    assert lines[0] == f"ids: {MAX_ITEMS + 7} items"
    assert lines[1:-1] == [f"- {i}" for i in range(MAX_ITEMS)]
    assert lines[-1] == "- … 7 more not shown"


def test_a_long_value_is_cut_with_a_note():
    text = render_success({"body": "x" * (MAX_VALUE_CHARS + 50)})
    assert text == "body: " + "x" * MAX_VALUE_CHARS + "… [cut: 50 more characters]"


def test_an_empty_result_says_so():
    assert render_success({}) == "(empty result)"


def test_a_cached_result_is_marked():
    text = render_success({"count": 1}, cached=True)
    assert text.splitlines() == ["(cached result from an identical earlier call)", "count: 1"]


def test_the_whole_text_is_capped_with_a_note_saying_what_was_cut():
    output = {f"field_{i}": "y" * 250 for i in range(40)}
    text = render_success(output)
    full = ", ".join(f"field_{i}: " + "y" * 250 for i in range(40))
    assert len(full) > MAX_CHARS
    assert (
        text
        == full[:MAX_CHARS]
        + f"\n[cut: {len(full) - MAX_CHARS} more characters not shown; the full result is stored]"
    )


def test_cap_leaves_short_text_alone_and_takes_a_limit():
    assert cap("short") == "short"
    assert (
        cap("abcdef", limit=4)
        == "abcd\n[cut: 2 more characters not shown; the full result is stored]"
    )


def test_a_failure_starts_with_the_marker_and_carries_its_status():
    assert render_failure("timeout", "get_order did not answer within 5 s.") == (
        f"{FAILURE_MARKER} (status: timeout): get_order did not answer within 5 s."
    )
    assert render_failure("rejected", "unknown tool 'x'").startswith(
        f"{FAILURE_MARKER} (status: rejected)"
    )


def test_a_huge_failure_message_is_capped_too():
    text = render_failure("failed", "e" * (MAX_CHARS * 2))
    assert text.startswith(f"{FAILURE_MARKER} (status: failed): eee")
    assert text.endswith("the full result is stored]")
    assert len(text) < MAX_CHARS + 100
