"""A workflow run's typed state reads and writes the stored shape runs always had."""

from workflows.state import UNSET, RunState

STORED = {
    "values": {"input": {"order": "SO-1"}, "order": {"total": 20}},
    "active": ["review"],
    "visits": {"lookup": 1, "review": 2},
    "progress": {"review": {"started": True, "call": "review#2"}},
    "status": {"lookup": "finished", "review": "active"},
    "last_output": {"total": 20},
    "deadline_at": 1765000000.5,
}


def test_a_stored_state_loads_and_writes_back_unchanged() -> None:
    state = RunState.from_json(STORED, "lookup")
    assert state.active == ["review"] and state.visits["review"] == 2
    assert state.progress["review"]["call"] == "review#2"
    assert state.result is UNSET and state.error is None
    assert state.to_json() == STORED


def test_the_step_changes_a_copy_not_the_stored_state() -> None:
    state = RunState.from_json(STORED, "lookup")
    state.values["order"]["total"] = 0
    state.active.append("notify")
    assert STORED["values"]["order"] == {"total": 20} and STORED["active"] == ["review"]


def test_a_result_of_null_is_kept_apart_from_no_result() -> None:
    state = RunState.from_json(STORED, "lookup")
    state.result = None
    assert state.to_json()["result"] is None
    assert "result" not in RunState.from_json(STORED, "lookup").to_json()


def test_an_empty_state_starts_at_the_start_node() -> None:
    state = RunState.from_json(None, "first")
    assert (state.active, state.visits, state.values) == (["first"], {"first": 1}, {})
    assert RunState.start("first", {"x": 1}).to_json() == {
        "values": {"input": {"x": 1}},
        "active": ["first"],
        "visits": {"first": 1},
        "progress": {},
        "status": {"first": "active"},
    }


def test_unknown_keys_are_kept_and_a_malformed_error_is_dropped() -> None:
    stored = {**STORED, "error": "not a dict", "from_a_newer_version": [1, 2]}
    state = RunState.from_json(stored, "lookup")
    assert state.error is None
    assert state.to_json() == {**STORED, "from_a_newer_version": [1, 2]}
    failed = RunState.from_json({**STORED, "error": {"node": "review", "message": "x"}}, "a")
    assert failed.error == {"node": "review", "message": "x"}
    assert failed.to_json()["error"] == {"node": "review", "message": "x"}
