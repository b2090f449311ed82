"""Token counts: the BPE tokenizers agree with an independent one (tiktoken), the estimate
is monotone, CJK-aware and rounds up at its stated ratio; requests and answers too."""

import dataclasses
import json
import math
import random

import pytest

from llm.types import ChatMessage, ChatRequest, ChatResponse, ToolCallRequest, ToolSpec
from memory import tokens
from memory.tokens import (
    DEFAULT_TOKENIZER,
    MESSAGE_OVERHEAD_TOKENS,
    EstimateTokenizer,
    TokenizerError,
    count_message_tokens,
    count_tokens,
    estimate_request_tokens,
    estimate_response_tokens,
    tokenizer_for,
    tokenizer_get,
    tokenizer_strictest,
)
from tests.reference_tokenizer import reference_tokens

ESTIMATE = EstimateTokenizer(4.0)

# Texts a tokenizer finds hard: JSON with ids and amounts, digits, Chinese, code, emoji.
SAMPLES = [
    "",
    "The parcel left the depot on Monday and the courier expects to deliver it soon.",
    json.dumps(
        {
            "order_id": "550e8400-e29b-41d4-a716-446655440000",
            "items": [{"sku": "SKU-000123", "qty": 2, "price": 1234.56}],
            "placed_at": "2026-11-27T09:15:00Z",
        }
    ),
    "您好，我的订单 SO-20261127-0042 还没有到，物流显示在海关被扣留了。请帮我查一下。",
    "def f(x):\n    return {k: v for k, v in x.items() if v is not None}\n",
    "1234567890 3.14159 -42 0xDEADBEEF 1e-9",
    "Émile a réservé 3 chambres à Zürich — 😀 ok",
    "<|endoftext|> is text here, not a special token",
]


@pytest.mark.parametrize("name", ["o200k_base", "cl100k_base"])
@pytest.mark.parametrize("text", SAMPLES)
def test_a_bpe_count_is_what_an_independent_tokenizer_counts(name: str, text: str) -> None:
    assert count_tokens(text, tokenizer_get(name)) == reference_tokens(text, name)


@pytest.mark.parametrize("name", ["o200k_base", "cl100k_base"])
def test_random_json_and_chinese_agree_with_the_independent_tokenizer(name: str) -> None:
    rng = random.Random(7)
    alphabet = 'abcdefghijklmnopqrstuvwxyz0123456789{}[]":,. -_订单物流海关退款您好'
    for _ in range(200):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 300)))
        assert count_tokens(text, tokenizer_get(name)) == reference_tokens(text, name), text


def test_a_long_text_keeps_its_count_and_another_text_is_counted_anew() -> None:
    counter = tokenizer_get("o200k_base")
    long = "订单 SO-1 " * 40
    assert counter.count(long) == reference_tokens(long, "o200k_base")
    assert counter.count(long + "x") == reference_tokens(long + "x", "o200k_base")
    assert counter.count(long) == reference_tokens(long, "o200k_base")


def test_the_kept_counts_stay_within_their_bound(monkeypatch) -> None:
    counter = tokens.Cl100kTokenizer()  # a fresh instance: its own memo
    monkeypatch.setattr(tokens, "MEMO_MAX_CHARS", 1000)
    texts = [f"{n}: " + "订单 SO-1 已发货 " * 20 for n in range(30)]
    for text in texts * 2:
        assert counter.count(text) == reference_tokens(text, "cl100k_base")
        assert counter._memo_chars <= 1000
    assert 0 < len(counter._memo) < len(texts)


def test_the_default_is_o200k_base() -> None:
    text = SAMPLES[2]
    assert DEFAULT_TOKENIZER == "o200k_base"
    assert count_tokens(text) == reference_tokens(text, "o200k_base")


def test_the_estimate_for_json_and_digits_was_far_below_the_real_count() -> None:
    """Why the estimate no longer counts for an OpenAI model (issue 34)."""
    text = json.dumps([{"id": f"{i:08d}-4e29-41d4-a716-{i:012d}", "n": i * 7} for i in range(50)])
    assert count_tokens(text, ESTIMATE) * 1.1875 < reference_tokens(text, "o200k_base")


# The estimate ------------------------------------------------------------------------


def test_empty_text_is_zero_tokens() -> None:
    assert count_tokens("", ESTIMATE) == 0 == count_tokens("")


def test_latin_text_is_ratio_characters_a_token_rounded_up() -> None:
    assert count_tokens("a", ESTIMATE) == 1
    assert count_tokens("abcd", ESTIMATE) == 1
    assert count_tokens("abcde", ESTIMATE) == 2
    assert count_tokens("x" * 400, ESTIMATE) == 100
    assert count_tokens("x" * 400, EstimateTokenizer(2.5)) == 160


def test_non_ascii_characters_count_one_token_each() -> None:
    assert count_tokens("订单异常", ESTIMATE) == 4
    assert count_tokens("ab订单", ESTIMATE) == 1 + 2
    assert count_tokens("字" * 100, ESTIMATE) > count_tokens("a" * 100, ESTIMATE) * 3


def test_a_longer_text_never_estimates_fewer_tokens() -> None:
    # (Not so for BPE: a longer prefix may merge into fewer tokens; engine/model/context.py's
    # cap_text checks every cut it keeps for that reason.)
    text = "The quick brown fox 跳过 the lazy dog. " * 5
    counts = [count_tokens(text[:n], ESTIMATE) for n in range(len(text) + 1)]
    assert counts == sorted(counts)


@pytest.mark.parametrize("ratio", [0, 0.4, 11, -1])
def test_an_estimate_needs_a_usable_ratio(ratio: float) -> None:
    with pytest.raises(TokenizerError, match="ratio"):
        tokenizer_get("estimate", ratio)


def test_an_unknown_tokenizer_is_a_typed_error_naming_the_known_ones() -> None:
    with pytest.raises(TokenizerError, match="unknown tokenizer 'p50k'.*o200k_base"):
        tokenizer_get("p50k")


# Which tokenizer, and the cache keys -----------------------------------------------------


def test_each_tokenizer_has_one_instance_and_a_key_naming_what_it_counts() -> None:
    assert tokenizer_get("o200k_base") is tokenizer_get("o200k_base", 9)
    assert tokenizer_get("estimate", 3) is tokenizer_get("estimate", 3.0)
    assert {t.key for t in (tokenizer_get("o200k_base"), tokenizer_get("estimate", 2.5))} == {
        "o200k_base",
        "estimate:2.5",
    }
    # The key of what stored messages were counted with before real tokenizers.
    assert ESTIMATE.key == "estimate:4"


def test_an_endpoint_without_a_tokenizer_gets_its_apis_default() -> None:
    assert tokenizer_for("openai").key == "o200k_base"
    assert tokenizer_for("rules").key == "estimate:4"
    anthropic = tokenizer_for("anthropic")
    assert anthropic.key == "max(o200k_base,estimate:3.5)"
    prose = SAMPLES[1]
    assert anthropic.count(prose) == math.ceil(len(prose) / 3.5) > count_tokens(prose)
    ids = SAMPLES[2]
    assert (
        anthropic.count(ids)
        == count_tokens(ids)
        > count_tokens(ids, tokenizer_get("estimate", 3.5))
    )
    assert tokenizer_for("anthropic", "cl100k_base").key == "cl100k_base"
    assert tokenizer_for("openai", "estimate", 2).key == "estimate:2"


def test_the_strictest_counts_the_most_of_each_and_one_tokenizer_stays_itself() -> None:
    o200k, cl100k = tokenizer_get("o200k_base"), tokenizer_get("cl100k_base")
    both = tokenizer_strictest([o200k, cl100k, o200k])
    assert both.key == "max(o200k_base,cl100k_base)"
    for text in SAMPLES:
        assert both.count(text) == max(o200k.count(text), cl100k.count(text))
    assert tokenizer_strictest([cl100k, cl100k]) is cl100k


# Messages, requests, answers -----------------------------------------------------------


def test_a_message_adds_its_overhead_and_extra() -> None:
    assert count_message_tokens("") == MESSAGE_OVERHEAD_TOKENS
    assert count_message_tokens("abcd", "abcdefgh", ESTIMATE) == MESSAGE_OVERHEAD_TOKENS + 1 + 2
    text = SAMPLES[3]
    assert count_message_tokens(text) == MESSAGE_OVERHEAD_TOKENS + reference_tokens(
        text, "o200k_base"
    )


LOOKUP = ToolCallRequest(id="c1", name="lookup", arguments={"order": "A-1", "note": "订单"})
LOOKUP_TOKENS = count_tokens("lookup", ESTIMATE) + count_tokens(
    json.dumps({"order": "A-1", "note": "订单"}, ensure_ascii=False), ESTIMATE
)


def test_a_request_counts_each_message_with_its_overhead() -> None:
    request = ChatRequest(
        messages=(
            ChatMessage(role="system", content="abcd" * 10),
            ChatMessage(role="user", content="订单异常"),
        )
    )
    assert estimate_request_tokens(request, ESTIMATE) == 2 * MESSAGE_OVERHEAD_TOKENS + 10 + 4
    assert estimate_request_tokens(request) == 2 * MESSAGE_OVERHEAD_TOKENS + reference_tokens(
        "abcd" * 10, "o200k_base"
    ) + reference_tokens("订单异常", "o200k_base")


def test_a_request_counts_tool_calls_and_tool_schemas() -> None:
    parameters = {"type": "object", "properties": {"order": {"type": "string"}}}
    request = ChatRequest(
        messages=(ChatMessage(role="assistant", tool_calls=(LOOKUP,)),),
        tools=(ToolSpec(name="lookup", description="Find an order.", parameters=parameters),),
    )
    schema_tokens = (
        count_tokens("lookup", ESTIMATE)
        + count_tokens("Find an order.", ESTIMATE)
        + count_tokens(json.dumps(parameters), ESTIMATE)
    )
    assert estimate_request_tokens(request, ESTIMATE) == (
        MESSAGE_OVERHEAD_TOKENS + LOOKUP_TOKENS + schema_tokens
    )


def test_an_empty_request_is_zero_tokens() -> None:
    assert estimate_request_tokens(ChatRequest(messages=())) == 0


def test_a_response_counts_its_text_and_tool_calls_without_overhead() -> None:
    assert estimate_response_tokens(ChatResponse(text="abcdefgh"), ESTIMATE) == 2
    assert estimate_response_tokens(ChatResponse(text="", tool_calls=[LOOKUP]), ESTIMATE) == (
        LOOKUP_TOKENS
    )
    both = ChatResponse(text="abcd", tool_calls=[LOOKUP, LOOKUP])
    assert estimate_response_tokens(both, ESTIMATE) == 1 + 2 * LOOKUP_TOKENS
    text = SAMPLES[2]
    assert estimate_response_tokens(ChatResponse(text=text)) == reference_tokens(text, "o200k_base")


def test_a_longer_answer_never_estimates_fewer_tokens() -> None:
    texts = ["", "ok", "ok, done", "ok, done: 订单已发货"]
    counts = [estimate_response_tokens(ChatResponse(text=t)) for t in texts]
    assert counts == sorted(counts) and counts[0] == 0


@pytest.fixture
def counted(monkeypatch):
    """The requests the estimate counted afresh (not answered from the thread's last)."""
    requests: list[object] = []
    real = tokens._request_tokens

    def counting(request, counter):
        requests.append(request)
        return real(request, counter)

    monkeypatch.setattr(tokens, "_request_tokens", counting)
    return requests


def test_the_same_request_is_counted_once_and_another_one_anew(counted) -> None:
    request = ChatRequest(messages=(ChatMessage(role="user", content="a" * 40),))
    assert estimate_request_tokens(request, ESTIMATE) == 14
    assert estimate_request_tokens(request, ESTIMATE) == 14
    assert counted == [request]
    # Equal, but another object: a step that builds a new request is counted again.
    twin = ChatRequest(messages=(ChatMessage(role="user", content="a" * 40),))
    other = ChatRequest(messages=(ChatMessage(role="user", content="b" * 80),))
    assert estimate_request_tokens(twin, ESTIMATE) == 14
    assert estimate_request_tokens(other, ESTIMATE) == 24
    assert estimate_request_tokens(request, ESTIMATE) == 14
    assert counted == [request, twin, other, request]


def test_the_same_request_with_another_tokenizer_is_counted_anew(counted) -> None:
    request = ChatRequest(messages=(ChatMessage(role="user", content="a" * 40),))
    assert estimate_request_tokens(request, ESTIMATE) == 14
    assert estimate_request_tokens(request, tokenizer_get("o200k_base")) == 4 + reference_tokens(
        "a" * 40, "o200k_base"
    )
    assert counted == [request, request]


def test_a_copy_with_other_limits_is_not_counted_again(counted) -> None:
    request = ChatRequest(messages=(ChatMessage(role="user", content="a" * 40),))
    capped = dataclasses.replace(request, max_tokens=100)  # what the budget gate hands on
    assert estimate_request_tokens(request, ESTIMATE) == 14
    assert estimate_request_tokens(capped, ESTIMATE) == 14
    assert counted == [request]
    fewer = dataclasses.replace(request, messages=request.messages[:0])
    assert estimate_request_tokens(fewer, ESTIMATE) == 0 and counted == [request, fewer]
