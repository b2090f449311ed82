"""Description checks: each problem named, nothing reported for a description that helps."""

from tools.descriptions import description_problems, tool_warnings

GOOD = (
    "Where a parcel is now and when it should arrive. Use when the customer asks about a "
    "delivery; do not use for returns."
)
PARAMS = {
    "type": "object",
    "properties": {"tracking_number": {"type": "string", "description": "The carrier's number"}},
}


def test_a_description_that_helps_the_model_has_no_problems():
    assert (
        description_problems(
            description=GOOD, parameters=PARAMS, result_description="Status and ETA."
        )
        == []
    )
    # An output schema (MCP) or a "Returns ..." sentence stands for the result description.
    assert (
        description_problems(description=GOOD, parameters=PARAMS, output_schema={"type": "object"})
        == []
    )
    assert description_problems(description=GOOD + " Returns the status.", parameters=PARAMS) == []


def test_each_missing_part_is_named():
    assert description_problems(
        description="Track parcel.",
        parameters={"type": "object", "properties": {"n": {"type": "string"}, "carrier": {}}},
    ) == [
        "description is too short (2 words) to say what it does; write a full sentence",
        "description does not say when to use it (e.g. 'Use when ...')",
        "description does not say when not to use it (e.g. 'Do not use for ...')",
        "parameters without a description: n, carrier",
        "no result description: say what it returns (result_description)",
    ]
    assert description_problems(description="", parameters={})[0] == (
        "no description: say what it does and when to use it"
    )


def test_warnings_name_the_tool():
    assert tool_warnings("track", ["x"]) == ["tool track: x"]


# Structure, in English and in Chinese (issue 34, item 10) -------------------------------

GOOD_ZH = "查询包裹的当前位置和预计送达时间。当客户询问配送进度时使用；不要用于退货或退款。"
ZH_PARAMS = {
    "type": "object",
    "properties": {"tracking_number": {"type": "string", "description": "承运商的运单号"}},
}


def test_a_good_chinese_description_has_no_problems():
    assert (
        description_problems(
            description=GOOD_ZH, parameters=ZH_PARAMS, result_description="包裹状态和预计送达日期。"
        )
        == []
    )
    # Its own "returns" clause stands for the result description, as in English.
    assert (
        description_problems(
            description=GOOD_ZH + "返回包裹状态和预计送达日期。", parameters=ZH_PARAMS
        )
        == []
    )


def test_a_chinese_description_that_names_things_in_english_is_judged_in_both():
    mixed = "Query the CRM 客户档案。适用于客户询问积分时；退款请改用 refund_order。Returns the profile."
    assert description_problems(description=mixed, parameters=ZH_PARAMS) == []


def test_a_short_chinese_description_is_too_short_in_words_not_characters():
    assert description_problems(description="查包裹。", parameters={}, result_description="x")[
        0
    ] == ("description is too short (2 words) to say what it does; write a full sentence")
    # Twelve characters are about six words: long enough, whatever else is missing.
    problems = description_problems(description="查询包裹的当前位置和送达时间", parameters={})
    assert not any("too short" in p for p in problems)


def test_each_missing_part_of_a_chinese_description_is_named():
    assert description_problems(
        description="查询包裹的当前位置和预计送达时间，信息来自承运商系统。",
        parameters={"type": "object", "properties": {"单号": {"type": "string"}}},
    ) == [
        "description does not say when to use it (e.g. 'Use when ...')",
        "description does not say when not to use it (e.g. 'Do not use for ...')",
        "parameters without a description: 单号",
        "no result description: say what it returns (result_description)",
    ]
    only_when = "当客户询问配送进度时使用，查询包裹的当前位置和预计送达时间。"
    assert description_problems(
        description=only_when, parameters=ZH_PARAMS, result_description="状态。"
    ) == ["description does not say when not to use it (e.g. 'Do not use for ...')"]


def test_a_bad_english_description_is_still_flagged_and_a_good_one_is_not():
    bad = "Looks up parcels in the carrier system and shows them."
    assert description_problems(description=bad, parameters=PARAMS, result_description="x") == [
        "description does not say when to use it (e.g. 'Use when ...')",
        "description does not say when not to use it (e.g. 'Do not use for ...')",
    ]
    assert description_problems(description=GOOD, parameters=PARAMS, result_description="x") == []


def test_a_language_without_markers_is_judged_on_its_structure_only():
    russian = "Показывает, где сейчас посылка и когда её доставят курьером."
    assert (
        description_problems(description=russian, parameters=PARAMS, result_description="Статус.")
        == []
    )
    assert description_problems(description=russian, parameters=PARAMS) == [
        "no result description: say what it returns (result_description)"
    ]
