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
