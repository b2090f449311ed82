"""Reading memory out of text without a model."""

from memory.extraction import (
    asks_to_remember,
    explicit_requests,
    rule_extract,
    subject_of,
)


def test_explicit_requests_in_english_and_chinese():
    found = explicit_requests("Hi! Please remember that my favourite colour is blue. Thanks")
    assert [(c.content, c.subject, c.tag) for c in found] == [
        ("my favourite colour is blue", "favourite colour", "preference")
    ]
    assert explicit_requests("记住：我的地址是上海")[0].content == "我的地址是上海"
    assert subject_of("我的地址是上海") == "地址"
    assert not asks_to_remember("I can't remember the order number")
    assert asks_to_remember("remember: invoices go out monthly")


def test_subjects_are_normalised():
    assert subject_of("My favorite color is red") == "favourite colour"
    assert subject_of("my   Shipping Address: 1 Main St") == "shipping address"
    assert subject_of("I like tea") == ""
    # Set phrases that name their subject without "my X is".
    assert subject_of("Call me Ada") == subject_of("my name is Ada") == "name"
    assert subject_of("I moved to Berlin") == subject_of("I live in Paris") == "home city"
    assert subject_of("I work at Acme") == subject_of("I'm working for Initech") == "employer"


def test_rule_extraction_is_deterministic():
    texts = ["Hello. My name is Ada. I prefer email over phone. What's the weather?"]
    found = rule_extract(texts)
    assert [(c.content, c.tag, c.subject) for c in found] == [
        ("My name is Ada.", "fact", "name"),
        ("I prefer email over phone.", "preference", ""),
    ]
    assert rule_extract(texts) == found
    assert rule_extract(["remember that my name is Ada"]) == []  # stored as an explicit request
