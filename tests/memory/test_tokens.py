"""The offline token estimate: monotone, CJK-aware, rounds up."""

from memory.tokens import MESSAGE_OVERHEAD_TOKENS, count_message_tokens, count_tokens


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
