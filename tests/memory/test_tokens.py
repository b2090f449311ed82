"""The offline token estimate: monotone, CJK-aware, rounds up; requests and answers too."""

import dataclasses
import json

import pytest

from llm.types import ChatMessage, ChatRequest, ChatResponse, ToolCallRequest, ToolSpec
from memory import tokens
from memory.tokens import (
    MESSAGE_OVERHEAD_TOKENS,
    count_message_tokens,
    count_tokens,
    estimate_request_tokens,
    estimate_response_tokens,
)


def test_empty_text_is_zero_tokens():
    assert count_tokens("") == 0


def test_latin_text_is_about_four_characters_a_token_rounded_up():
    assert count_tokens("a") == 1
    assert count_tokens("abcd") == 1
    assert count_tokens("abcde") == 2
    assert count_tokens("x" * 400) == 100


def test_non_ascii_characters_count_one_token_each():
    assert count_tokens("订单异常") == 4
    assert count_tokens("ab订单") == 1 + 2
    # Far more tokens than the same number of ASCII characters.
    assert count_tokens("字" * 100) > count_tokens("a" * 100) * 3


def test_longer_text_never_counts_fewer_tokens():
    text = "The quick brown fox 跳过 the lazy dog. " * 5
    counts = [count_tokens(text[:n]) for n in range(len(text) + 1)]
    assert counts == sorted(counts)


def test_a_message_adds_its_overhead_and_extra():
    assert count_message_tokens("") == MESSAGE_OVERHEAD_TOKENS
    assert count_message_tokens("abcd", "abcdefgh") == MESSAGE_OVERHEAD_TOKENS + 1 + 2


LOOKUP = ToolCallRequest(id="c1", name="lookup", arguments={"order": "A-1", "note": "订单"})
LOOKUP_TOKENS = count_tokens("lookup") + count_tokens(
    json.dumps({"order": "A-1", "note": "订单"}, ensure_ascii=False)
)


def test_a_request_counts_each_message_with_its_overhead():
    request = ChatRequest(
        messages=(
            ChatMessage(role="system", content="abcd" * 10),
            ChatMessage(role="user", content="订单异常"),
        )
    )
    assert estimate_request_tokens(request) == 2 * MESSAGE_OVERHEAD_TOKENS + 10 + 4


def test_a_request_counts_tool_calls_and_tool_schemas():
    parameters = {"type": "object", "properties": {"order": {"type": "string"}}}
    request = ChatRequest(
        messages=(ChatMessage(role="assistant", tool_calls=(LOOKUP,)),),
        tools=(ToolSpec(name="lookup", description="Find an order.", parameters=parameters),),
    )
    schema_tokens = (
        count_tokens("lookup")
        + count_tokens("Find an order.")
        + count_tokens(json.dumps(parameters))
    )
    assert estimate_request_tokens(request) == (
        MESSAGE_OVERHEAD_TOKENS + LOOKUP_TOKENS + schema_tokens
    )


def test_an_empty_request_is_zero_tokens():
    assert estimate_request_tokens(ChatRequest(messages=())) == 0


def test_a_response_counts_its_text_and_tool_calls_without_overhead():
    assert estimate_response_tokens(ChatResponse(text="abcdefgh")) == 2
    assert estimate_response_tokens(ChatResponse(text="", tool_calls=[LOOKUP])) == LOOKUP_TOKENS
    both = ChatResponse(text="abcd", tool_calls=[LOOKUP, LOOKUP])
    assert estimate_response_tokens(both) == 1 + 2 * LOOKUP_TOKENS


def test_a_longer_answer_never_estimates_fewer_tokens():
    texts = ["", "ok", "ok, done", "ok, done: 订单已发货"]
    counts = [estimate_response_tokens(ChatResponse(text=t)) for t in texts]
    assert counts == sorted(counts) and counts[0] == 0


@pytest.fixture
def counted(monkeypatch):
    """The requests the estimate counted afresh (not answered from the thread's last)."""
    requests: list[object] = []
    real = tokens._request_tokens

    def counting(request):
        requests.append(request)
        return real(request)

    monkeypatch.setattr(tokens, "_request_tokens", counting)
    return requests


def test_the_same_request_is_counted_once_and_another_one_anew(counted):
    request = ChatRequest(messages=(ChatMessage(role="user", content="a" * 40),))
    assert estimate_request_tokens(request) == estimate_request_tokens(request) == 14
    assert counted == [request]
    # Equal, but another object: a step that builds a new request is counted again.
    twin = ChatRequest(messages=(ChatMessage(role="user", content="a" * 40),))
    other = ChatRequest(messages=(ChatMessage(role="user", content="b" * 80),))
    assert estimate_request_tokens(twin) == 14 and estimate_request_tokens(other) == 24
    assert estimate_request_tokens(request) == 14
    assert counted == [request, twin, other, request]


def test_a_copy_with_other_limits_is_not_counted_again(counted):
    request = ChatRequest(messages=(ChatMessage(role="user", content="a" * 40),))
    capped = dataclasses.replace(request, max_tokens=100)  # what the budget gate hands on
    assert estimate_request_tokens(request) == estimate_request_tokens(capped) == 14
    assert counted == [request]
    fewer = dataclasses.replace(request, messages=request.messages[:0])
    assert estimate_request_tokens(fewer) == 0 and counted == [request, fewer]
