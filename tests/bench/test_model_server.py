"""bench/model_server.py: a session's later turns get the scripted tool round too."""

from bench.model_server import _after_tool


def test_a_tool_message_of_an_earlier_turn_does_not_answer_this_one() -> None:
    """`sustained` posts several turns per session: the history holds the last turn's tool
    result, and the scripted model answered the new turn at once (one model call, not two)."""
    earlier = [
        {"role": "user", "content": "what time is it? s-1"},
        {"role": "assistant", "tool_calls": [{"id": "c1"}]},
        {"role": "tool", "tool_call_id": "c1", "content": "12:00"},
        {"role": "assistant", "content": "It is noon."},
    ]
    new_turn = {"messages": [*earlier, {"role": "user", "content": "what time is it? s-1"}]}
    after_its_tool = {
        "messages": [
            *new_turn["messages"],
            {"role": "assistant", "tool_calls": [{"id": "c2"}]},
            {"role": "tool", "tool_call_id": "c2", "content": "12:01"},
        ]
    }

    assert _after_tool(new_turn) is False
    assert _after_tool(after_its_tool) is True
    assert _after_tool({"messages": earlier[:3]}) is True
