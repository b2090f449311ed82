"""The client's typed events mirror the server's event contract (record/events.py)."""

from dataclasses import fields
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
from agentplatform_client import (
    EVENT_TYPES,
    ApprovalRequested,
    ErrorEvent,
    Event,
    LastTurn,
    MessageCompleted,
    Session,
    StateChanged,
    ToolFinished,
    TurnCalls,
    TurnFinished,
    parse_event,
)

from record.events import PAYLOADS, EventType


@pytest.mark.parametrize("event_type", list(EventType))
def test_every_server_event_type_has_a_client_class_with_every_payload_key(event_type):
    cls = EVENT_TYPES[event_type.value]
    assert event_type.value == cls.TYPE
    attributes = {f.name for f in fields(cls)}
    payload: Any = PAYLOADS[event_type]  # a TypedDict class
    keys = set(payload.__required_keys__) | set(payload.__optional_keys__)
    missing = {k for k in keys if cls.RENAMED.get(k, k) not in attributes}
    assert not missing, f"{cls.__name__} lacks {sorted(missing)}"


def test_the_client_knows_no_type_the_server_does_not_send():
    assert set(EVENT_TYPES) == {t.value for t in EventType}


def _frame(type_, data, seq=7):
    return {
        "seq": seq,
        "type": type_,
        "session": "0b6c7c0e-3c47-4f41-9d6a-0d8e3d5f1a2b",
        "ts": "2026-11-30T16:00:00.123456Z",
        "data": data,
    }


def test_state_changed_renames_the_keyword_keys_and_keeps_the_envelope():
    event = parse_event(
        _frame("state.changed", {"from": "idle", "to": "processing", "trigger": "t", "reason": ""})
    )
    assert isinstance(event, StateChanged)
    assert (event.from_state, event.to_state, event.trigger) == ("idle", "processing", "t")
    assert event.seq == 7 and event.persisted
    assert event.ts == datetime(2026, 11, 30, 16, 0, 0, 123456, tzinfo=UTC)
    assert event.data["from"] == "idle"


def test_message_completed_keeps_its_history_seq_apart_from_the_event_seq():
    event = parse_event(
        _frame(
            "message.completed",
            {
                "seq": 3,
                "role": "assistant",
                "content": "hi",
                "turn": 1,
                "tool_calls": [{"id": "a"}],
            },
        )
    )
    assert isinstance(event, MessageCompleted)
    assert (event.seq, event.message_seq, event.tool_calls) == (7, 3, [{"id": "a"}])


def test_turn_finished_usage_is_typed_with_a_decimal_cost():
    event = parse_event(
        _frame(
            "turn.finished",
            {
                "turn": 2,
                "stop_reason": "answer",
                "iterations": 3,
                "usage": {"input_tokens": 10, "output_tokens": 4, "cost": "0.000120"},
            },
        )
    )
    assert isinstance(event, TurnFinished)
    assert event.usage.cost == Decimal("0.000120") and event.usage.input_tokens == 10
    assert event.reason == ""


def test_turn_finished_carries_the_turns_outcome_and_its_calls_typed():
    event = parse_event(
        _frame(
            "turn.finished",
            {
                "turn": 1,
                "stop_reason": "answer",
                "iterations": 2,
                "usage": {"input_tokens": 1, "output_tokens": 1, "cost": "0"},
                "outcome": "tool_failures",
                "calls": {"ok": 1, "failed": 0, "rejected": 3, "expired": 0, "unpaid": 0},
            },
        )
    )
    assert isinstance(event, TurnFinished)
    assert event.outcome == "tool_failures"
    assert event.calls == TurnCalls(ok=1, rejected=3) and event.calls.not_done == 3


def test_a_call_that_ran_with_an_approvers_edit_shows_both_inputs():
    event = parse_event(
        _frame(
            "tool.finished",
            {
                "call_id": "c", "tool": "issue_coupon", "status": "success", "error": "", "turn": 1,
                "input": {"amount": 20}, "proposed_input": {"amount": 60},
            },
        )
    )  # fmt: skip
    assert isinstance(event, ToolFinished)
    assert (event.input, event.proposed_input, event.refusal) == (
        {"amount": 20},
        {"amount": 60},
        "",
    )


def test_a_session_shows_its_last_turn():
    data = {"id": "s", "last_turn": {"turn": 2, "outcome": "stopped", "calls": {"unpaid": 2}}}
    session = Session.from_dict(data)
    assert session.last_turn == LastTurn(turn=2, outcome="stopped", calls=TurnCalls(unpaid=2))
    assert Session.from_dict({"id": "s", "last_turn": None}).last_turn is None


def test_optional_keys_default_and_nulls_keep_the_default():
    event = parse_event(
        _frame("tool.finished", {"call_id": "c", "tool": "t", "status": "error", "error": "x", "turn": 1, "probed": None})
    )  # fmt: skip
    assert isinstance(event, ToolFinished)
    assert event.elapsed_ms is None and event.output is None and event.probed is None


def test_an_ephemeral_error_frame_has_no_seq_and_carries_details():
    event = parse_event(
        _frame("error", {"code": "invalid_input", "message": "m", "details": {"a": 1}}, seq=None)
    )
    assert isinstance(event, ErrorEvent)
    assert not event.persisted and event.details == {"a": 1}


def test_an_unknown_type_comes_through_as_a_generic_event():
    event = parse_event(_frame("budget.warning", {"left": 3}))
    assert type(event) is Event
    assert (event.type, event.data, event.seq) == ("budget.warning", {"left": 3}, 7)


def test_unknown_payload_keys_stay_in_data():
    event = parse_event(
        _frame(
            "approval.requested",
            {"approval_id": "a", "tool": "t", "arguments": {}, "risk_level": 2, "deadline": "d", "new": 1},
        )
    )  # fmt: skip
    assert isinstance(event, ApprovalRequested)
    assert event.risk_level == 2 and event.data["new"] == 1


def test_a_turn_without_an_answer_answers_nothing_not_the_previous_turns():
    from agentplatform_client.client import TurnResult

    # run_turn's events include a turn that was running when the message was sent.
    earlier = parse_event(
        _frame(
            "message.completed", {"seq": 2, "role": "assistant", "content": "old", "turn": 1}, seq=3
        )
    )
    own_end = parse_event(_frame("turn.finished", {"turn": 2, "outcome": "stopped"}, seq=9))
    assert TurnResult(events=[earlier, own_end], finished=own_end).answer == ""
    answered = parse_event(
        _frame(
            "message.completed", {"seq": 4, "role": "assistant", "content": "new", "turn": 2}, seq=8
        )
    )
    result = TurnResult(events=[earlier, answered, own_end], finished=own_end)
    assert result.answer == "new"
