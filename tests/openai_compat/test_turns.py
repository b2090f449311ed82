"""openai_compat.turns: what a request sends for its turn's frames, and how the turn ended."""

from typing import Any

import pytest

from openai_compat.turns import (
    RATE_LIMITED_RETRY_AFTER_S,
    ErrorReply,
    FailureFacts,
    TurnReader,
    failure_reply,
)


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


def test_a_handoff_in_the_turn_names_the_agent_that_answers() -> None:
    reader = TurnReader(session_id="s")
    assert reader.agent == ""
    _feed(
        reader,
        [
            _f("agent.changed", **{"from": "triage", "to": "billing", "reason": "invoices"}),
            _f("message.completed", seq=5, role="assistant", content="billing here", turn=1),
            _finished(),
        ],
    )
    assert reader.agent == "billing"
    assert reader.outcome is not None and reader.outcome.content == "billing here"


def test_text_the_stream_missed_is_sent_from_the_stored_message_once_the_turn_answered() -> None:
    reader = TurnReader(session_id="s")
    sent = _feed(
        reader,
        [
            _f("message.delta", text="Hel", turn=1),  # the tail's delta was lost
            _f("message.completed", seq=2, role="assistant", content="Hello", turn=1),
        ],
    )
    assert sent == "Hel"  # the rest waits for the turn's end, in the same commit
    assert reader.feed(_finished()) == "lo"
    reader = TurnReader(session_id="s")
    assert reader.feed(_f("message.completed", seq=2, role="assistant", content="Hi", turn=1)) == ""
    assert reader.feed(_finished()) == "Hi"


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


def test_frames_after_the_end_change_nothing_and_a_timeout_keeps_what_was_said() -> None:
    reader = TurnReader(session_id="s")
    _feed(reader, [_f("message.delta", text="Part", turn=1)])
    assert reader.timed_out() == ""
    assert reader.outcome is not None
    assert (reader.outcome.content, reader.outcome.finish_reason) == ("Part", "length")
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


@pytest.mark.parametrize(
    "stop",
    [
        "model_unavailable",
        "model_refused",
        "invalid_output",
        "error",
        "budget_exceeded",
        "insufficient_credits",
    ],
)
def test_a_failed_turn_is_a_failure_not_an_answer_and_its_busy_message_is_not_sent(
    stop: str,
) -> None:
    """The engine stores the agent's busy message as the failed turn's answer: a client must
    get an error, never that text as if the model had said it."""
    reader = TurnReader(session_id="s")
    sent = _feed(
        reader,
        [
            _f("message.completed", seq=2, role="assistant", content="Busy, try later.", turn=1),
            _finished(stop),
        ],
    )
    assert sent == ""
    assert reader.outcome is not None
    assert (reader.outcome.failure, reader.outcome.turn) == (stop, 1)


def test_text_streamed_before_a_failure_stays_sent_and_the_outcome_is_a_failure() -> None:
    reader = TurnReader(session_id="s")
    sent = _feed(
        reader,
        [
            _f("message.delta", text="The parcel", turn=1),
            _f("message.completed", seq=2, role="assistant", content="Busy.", turn=1),
            _finished("model_unavailable"),
        ],
    )
    assert sent == "The parcel"
    assert reader.outcome is not None and reader.outcome.failure == "model_unavailable"


def test_a_buffered_answer_is_sent_whole_from_the_stored_message() -> None:
    """With response_format the answer may be repaired: its first try's deltas are not sent."""
    reader = TurnReader(session_id="s", buffer_answer=True)
    sent = _feed(
        reader,
        [
            _f("message.delta", text="{not json", turn=1),
            _f("message.completed", seq=2, role="assistant", content='{"a": 1}', turn=1),
            _finished(),
        ],
    )
    assert sent == '{"a": 1}'
    assert reader.outcome is not None and reader.outcome.content == '{"a": 1}'


def _reply(stop: str, **facts: Any) -> ErrorReply:
    return failure_reply(stop, FailureFacts(**facts))


def test_no_model_could_answer_is_a_502_naming_the_reason() -> None:
    reply = _reply(
        "model_unavailable", last_error="'main' did not answer", outcomes=("timeout", "unavailable")
    )
    assert (reply.status, reply.retry_after_s) == (502, None)
    error = reply.body["error"]
    assert (error["type"], error["code"]) == ("server_error", "model_unavailable")
    assert "'main' did not answer" in error["message"]
    refused = _reply("model_refused", last_error="401 bad key", outcomes=("bad_request",))
    assert (refused.status, refused.body["error"]["code"]) == (502, "model_refused")
    breaker = _reply("model_unavailable", outcomes=("breaker_open",))
    assert (breaker.status, breaker.body["error"]["code"]) == (502, "model_unavailable")


def test_a_rate_limited_model_is_a_503_with_retry_after() -> None:
    reply = _reply("model_unavailable", outcomes=("rate_limited",), retry_after_s=7.2)
    assert (reply.status, reply.retry_after_s) == (503, 8)
    assert reply.body["error"]["code"] == "model_overloaded"
    unknown = _reply("model_unavailable", outcomes=("timeout", "rate_limited"))
    assert (unknown.status, unknown.retry_after_s) == (503, RATE_LIMITED_RETRY_AFTER_S)


def test_the_other_failures_have_their_own_status() -> None:
    invalid = _reply("invalid_output", last_error="(top): 'city' is a required property")
    assert (invalid.status, invalid.body["error"]["code"]) == (502, "invalid_json")
    assert invalid.body["error"]["param"] == "response_format"
    assert "'city' is a required property" in invalid.body["error"]["message"]
    budget = _reply("budget_exceeded")
    assert (budget.status, budget.body["error"]["type"]) == (429, "insufficient_quota")
    credits = _reply("insufficient_credits")
    assert (credits.status, credits.body["error"]["code"]) == (429, "insufficient_quota")
    crashed = _reply("error", last_error="boom")
    assert (crashed.status, crashed.body["error"]["code"]) == (500, "turn_failed")


def test_a_failure_is_final_when_a_retry_would_not_cure_it_or_a_side_effect_ran() -> None:
    """`x-should-retry: false` (final): the client libraries retry a 5xx by default, and each
    retry is a new turn that would send the side effect again."""
    retryable = [
        _reply("model_unavailable"),
        _reply("model_unavailable", outcomes=("rate_limited",)),
        _reply("invalid_output"),
        _reply("error"),
    ]
    assert [r.final for r in retryable] == [False] * 4
    final = [_reply("model_refused"), _reply("budget_exceeded"), _reply("insufficient_credits")]
    assert [r.final for r in final] == [True] * 3
    after = [_reply(stop, side_effects=True) for stop in ("model_unavailable", "error")]
    assert [(r.status, r.final) for r in after] == [(502, True), (500, True)]
    overloaded = _reply("model_unavailable", outcomes=("rate_limited",), side_effects=True)
    assert (overloaded.status, overloaded.final, overloaded.retry_after_s) == (503, True, 5)


def test_a_pause_for_the_clients_tools_is_tool_calls_whichever_comes_first() -> None:
    calls = _f(
        "progress",
        stage="client_tools",
        turn=1,
        calls=[{"call_id": "c1", "tool": "get_weather", "input": {"city": "Paris"}}],
    )
    said = _f("message.completed", seq=2, role="assistant", content="Let me check.", turn=1,
              tool_calls=[{"id": "c1"}])  # fmt: skip
    for frames in (
        [said, calls, _state("paused_for_user")],
        [said, _state("paused_for_user"), calls],
    ):
        reader = TurnReader(session_id="s")
        assert _feed(reader, frames) == ""
        outcome = reader.outcome
        assert outcome is not None
        assert (outcome.finish_reason, outcome.content) == ("tool_calls", "Let me check.")
        assert outcome.tool_calls == [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ]
        assert outcome.extension == {"session_id": "s", "status": "awaiting_tool_results"}
