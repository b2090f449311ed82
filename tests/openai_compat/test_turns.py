"""openai_compat.turns: what a request sends for its turn's frames, and how the turn ended."""

from typing import Any

from openai_compat.turns import TurnReader


def _f(kind: str, **data: Any) -> dict[str, Any]:
    return {"seq": None, "type": kind, "data": data}


def _state(to: str) -> dict[str, Any]:
    return _f("state.changed", **{"from": "processing", "to": to, "trigger": "", "reason": ""})


def _feed(reader: TurnReader, frames: list[dict[str, Any]]) -> str:
    return "".join(reader.feed(frame) for frame in frames)


def _finished(stop: str = "answer", tokens: tuple[int, int] = (10, 5)) -> dict[str, Any]:
    usage = {"input_tokens": tokens[0], "output_tokens": tokens[1], "cost": "0"}
    return _f("turn.finished", turn=1, stop_reason=stop, iterations=1, usage=usage)


def test_deltas_stream_and_the_stored_answer_is_not_sent_twice() -> None:
    reader = TurnReader(session_id="s")
    sent = _feed(
        reader,
        [
            _f("message.delta", text="Hel", turn=1),
            _f("message.delta", text="lo", turn=1),
            _f("message.completed", seq=2, role="assistant", content="Hello", turn=1),
            _finished(),
        ],
    )
    assert sent == "Hello"
    assert reader.outcome is not None
    assert (reader.outcome.content, reader.outcome.finish_reason) == ("Hello", "stop")
    assert reader.outcome.totals == (10, 5)
    assert reader.outcome.extension == {
        "session_id": "s",
        "status": "finished",
        "stop_reason": "answer",
    }


def test_text_the_stream_missed_is_sent_from_the_stored_message() -> None:
    reader = TurnReader(session_id="s")
    sent = _feed(
        reader,
        [
            _f("message.delta", text="Hel", turn=1),  # the tail's delta was lost
            _f("message.completed", seq=2, role="assistant", content="Hello", turn=1),
        ],
    )
    assert sent == "Hello"
    reader = TurnReader(session_id="s")
    assert (
        reader.feed(_f("message.completed", seq=2, role="assistant", content="Hi", turn=1)) == "Hi"
    )


def test_text_before_tool_calls_is_set_apart_and_not_the_answer() -> None:
    reader = TurnReader(session_id="s")
    sent = _feed(
        reader,
        [
            _f("message.delta", text="Let me look.", turn=1),
            _f("message.completed", seq=2, role="assistant", content="Let me look.", turn=1, tool_calls=[{"id": "c"}]),
            _f("tool.started", call_id="c", tool="t", input={}, turn=1),
            _f("message.delta", text="Found it.", turn=1),
            _f("message.completed", seq=4, role="assistant", content="Found it.", turn=1),
            _finished(),
        ],
    )  # fmt: skip
    assert sent == "Let me look.\n\nFound it."
    assert reader.outcome is not None and reader.outcome.content == "Found it."


def test_a_question_ends_the_request_whichever_comes_first() -> None:
    question = _f("progress", stage="question", turn=1, question="Which day?", options=["Mon"])
    for frames in ([_state("paused_for_user"), question], [question, _state("paused_for_user")]):
        reader = TurnReader(session_id="s")
        sent = _feed(reader, frames)
        assert sent == "Which day? (options: Mon)"
        assert reader.outcome is not None and reader.outcome.totals is None
        assert reader.outcome.extension == {
            "session_id": "s",
            "status": "awaiting_user",
            "question": "Which day?",
            "options": ["Mon"],
        }


def test_a_pause_without_its_details_settles_with_what_is_known() -> None:
    reader = TurnReader(session_id="s")
    assert reader.feed(_state("awaiting_approval")) == ""
    assert reader.outcome is None and reader.paused == "awaiting_approval"
    assert "Waiting for approval" in reader.settle()
    assert reader.outcome is not None
    assert reader.outcome.extension["status"] == "awaiting_approval"


def test_an_approval_request_names_the_tool() -> None:
    reader = TurnReader(session_id="s")
    requested = _f(
        "approval.requested",
        approval_id="a1",
        tool="refund",
        arguments={},
        risk_level=2,
        deadline="",
    )
    sent = _feed(reader, [requested, _state("awaiting_approval")])  # fmt: skip
    assert sent.startswith("Waiting for approval of refund (approval a1)")
    assert reader.outcome is not None and reader.outcome.extension["approval_id"] == "a1"


def test_a_turn_that_ends_without_an_answer_says_why() -> None:
    reader = TurnReader(session_id="s")
    sent = _feed(reader, [_finished("max_iterations")])
    assert sent == "(The turn ended without an answer: max_iterations.)"
    assert reader.outcome is not None and reader.outcome.finish_reason == "stop"
    reader = TurnReader(session_id="s")
    _feed(
        reader,
        [
            _f("message.completed", seq=2, role="assistant", content="No.", turn=1),
            _finished("model_refused"),
        ],
    )
    assert reader.outcome is not None and reader.outcome.finish_reason == "content_filter"


def test_frames_after_the_end_change_nothing_and_a_timeout_keeps_what_was_said() -> None:
    reader = TurnReader(session_id="s")
    _feed(reader, [_f("message.delta", text="Part", turn=1)])
    outcome = reader.timed_out()
    assert (outcome.content, outcome.finish_reason) == ("Part", "length")
    assert reader.feed(_f("message.delta", text="more", turn=1)) == ""


def test_a_late_delta_of_an_answer_already_read_is_not_sent_again() -> None:
    reader = TurnReader(session_id="s")
    sent = _feed(
        reader,
        [
            # The database was read before the channel's queued deltas were.
            _f("message.completed", seq=2, role="assistant", content="Hello", turn=1),
            _f("message.delta", text="Hello", turn=1),
            _finished(),
        ],
    )
    assert sent == "Hello"
