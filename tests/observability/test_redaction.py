import pytest

from observability.redaction import digest, scrub, scrub_value

API_KEY = "ap_Zq3xKp9LmN2vB7wR4tY8"
EMAIL = "jane.roe+orders@example.org"
CARD = "4242 4242 4242 4242"


@pytest.mark.parametrize(
    ("text", "gone", "kind"),
    [
        (f"key {API_KEY} used", API_KEY, "[redacted:key]"),
        (
            "provider key sk-proj-abcdefghijklmnop1234",
            "sk-proj-abcdefghijklmnop1234",
            "[redacted:key]",
        ),
        ("Authorization: Bearer abcdefghijklmnopqrstu", "abcdefghijklmnopqrstu", "[redacted:key]"),
        ('{"api_key": "hunter2-secret-value"}', "hunter2-secret-value", "[redacted:key]"),
        (f"write to {EMAIL} today", EMAIL, "[redacted:email]"),
        (f"card {CARD} declined", CARD, "[redacted:card]"),
        ("card 4242-4242-4242-4242 declined", "4242-4242-4242-4242", "[redacted:card]"),
        ("card 4242424242424242 declined", "4242424242424242", "[redacted:card]"),
    ],
)
def test_scrub_cuts_credentials_and_personal_data(text: str, gone: str, kind: str) -> None:
    out = scrub(text)
    assert gone not in out
    assert kind in out


@pytest.mark.parametrize(
    "text",
    [
        "order 1234567890123 shipped",  # 13 digits, fails the Luhn check: not a card
        "token counting took 12 ms",
        "session 6f1c2d3e-aaaa-bbbb-cccc-1234567890ab turn 3",
        # A Luhn-valid 4-4-4-4 run inside a UUID (found by a random session id in CI).
        "session a11d1644-5100-4580-8811-6d6d5256a540 turn 3",
        "session 12345678-1644-5100-4580-881166d6d525 turn 3",
        "elapsed_ms=1234 status=200",
    ],
)
def test_scrub_leaves_ordinary_text_alone(text: str) -> None:
    assert scrub(text) == text


def test_scrub_value_walks_json() -> None:
    value = {"to": [EMAIL], "n": 3, "nested": {"card": CARD}}
    assert scrub_value(value) == {
        "to": ["[redacted:email]"],
        "n": 3,
        "nested": {"card": "[redacted:card]"},
    }


def test_digest_is_size_and_hash_never_the_content() -> None:
    args = {"email": EMAIL, "card": CARD}
    d = digest(args)
    size, _, short_hash = d.partition(":")
    assert size.endswith("B") and int(size[:-1]) > 0
    assert len(short_hash) == 12
    assert EMAIL not in d and CARD not in d
    # Canonical: key order does not change it; content does.
    assert digest({"card": CARD, "email": EMAIL}) == d
    assert digest({"email": EMAIL, "card": "4000 0000 0000 0002"}) != d
