"""The dialogue-state extractor: intents and slots from keywords, patterns and synonyms."""

import pytest

from memory.dialogue import (
    SLOT_VALUE_MAX_CHARS,
    dialogue_config_problem,
    extract,
    extractor_for,
)

CONFIG = {
    "intents": [
        {"name": "refund", "keywords": ["refund", "money back"]},
        {"name": "track", "patterns": [r"(?i)\bwhere is\b", r"(?i)\bnot (arrived|received)\b"]},
        {"name": "greeting", "keywords": ["hello"]},
    ],
    "slots": [
        {"name": "order", "patterns": [r"\b(SO-\d+)\b"]},
        {"name": "amount", "patterns": [r"(?P<value>\d+) ?(?:yuan|eur|usd)"]},
        {"name": "carrier", "values": {"SF": ["sf express", "顺丰"], "DHL": []}},
    ],
}


def _run(texts: list[str], previous: dict | None = None, turn: int = 1) -> dict:
    pairs = [(i + 1 + int((previous or {}).get("seq") or 0), t) for i, t in enumerate(texts)]
    return dict(extract(extractor_for(CONFIG), previous, pairs, turn=turn))


def test_keywords_and_patterns_set_the_intent_and_slots():
    state = _run(["Where is my order SO-1001? It was sent with 顺丰."])
    assert state["intent"] == "track"
    assert state["slots"] == {"order": "SO-1001", "carrier": "SF"}
    assert state["slot_turns"] == {"order": 1, "carrier": 1}
    assert (state["turn"], state["seq"], state["intent_turn"]) == (1, 1, 1)


def test_the_first_intent_in_the_list_wins_and_case_is_ignored():
    # "refund" comes before "greeting" in the config, whatever the order in the text.
    assert _run(["Hello, I want a REFUND"])["intent"] == "refund"


def test_slots_carry_over_until_changed_and_the_intent_until_another_holds():
    first = _run(["my parcel SO-1 has not arrived"], turn=1)
    second = _run(["I want 50 yuan back as a refund"], previous=first, turn=2)
    assert second["intent"] == "refund"
    assert second["slots"] == {"order": "SO-1", "amount": "50"}
    assert second["slot_turns"] == {"order": 1, "amount": 2}
    # An answer that matches no intent keeps the intent; a new order replaces the old one.
    third = _run(["sorry, it is SO-2 via dhl"], previous=second, turn=3)
    assert third["intent"] == "refund" and third["intent_turn"] == 2
    assert third["slots"] == {"order": "SO-2", "amount": "50", "carrier": "DHL"}
    assert third["slot_turns"]["order"] == 3
    assert third["seq"] == 3


def test_named_group_then_first_group_then_whole_match():
    config = {
        "slots": [
            {"name": "a", "patterns": [r"a=(?P<value>\w+)"]},
            {"name": "b", "patterns": [r"b=(\w+)"]},
            {"name": "c", "patterns": [r"c\d"]},
        ]
    }
    state = extract(extractor_for(config), None, [(1, "a=x b=y c7")], turn=1)
    assert state["slots"] == {"a": "x", "b": "y", "c": "c7"}


def test_a_slot_value_is_cut_to_its_limit():
    config = {"slots": [{"name": "note", "patterns": [r"note: (.+)"]}]}
    state = extract(extractor_for(config), None, [(1, "note: " + "x" * 500)], turn=1)
    assert len(state["slots"]["note"]) == SLOT_VALUE_MAX_CHARS


def test_no_config_extracts_nothing():
    assert extractor_for({}).empty and extractor_for(None).empty


@pytest.mark.parametrize(
    ("config", "problem"),
    [
        ("x", "dialogue: must be a mapping"),
        ({"intent": []}, "dialogue.intent: unknown key"),
        ({"intents": [{"name": "a"}]}, "dialogue.intents[0]: needs keywords or patterns"),
        (
            {"intents": [{"name": "a", "patterns": ["("]}]},
            "dialogue.intents[0].patterns[0]: not a valid",
        ),
        (
            {"intents": [{"name": "a", "keywords": "x"}]},
            "dialogue.intents[0].keywords: must be a list",
        ),
        (
            {"slots": [{"name": "1 bad", "patterns": ["x"]}]},
            "dialogue.slots[0].name: must be a name",
        ),
        ({"slots": [{"name": "s", "values": ["a"]}]}, "dialogue.slots[0].values: must map"),
        (
            {"slots": [{"name": "s", "patterns": ["x"]}, {"name": "s", "patterns": ["y"]}]},
            "dialogue.slots[1].name: duplicate name 's'",
        ),
    ],
)
def test_a_wrong_config_is_named_by_its_path(config, problem):
    found = dialogue_config_problem(config)
    assert found is not None and found.startswith(problem), found
    assert extractor_for(config).empty  # a broken config (bypassing the checks) extracts nothing


def test_a_good_config_has_no_problem():
    assert dialogue_config_problem(CONFIG) is None
    assert dialogue_config_problem({}) is None
