"""The dialogue-state extractor: intents and slots from keywords, patterns and synonyms."""

import pytest

from memory.dialogue import (
    SLOT_VALUE_MAX_CHARS,
    dialogue_config_problem,
    extract,
    extractor_for,
    model_input,
    model_instructions,
    state_from_model,
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
        ({"extractor": "llm", "intents": []}, "dialogue.extractor: must be rules or model"),
        (
            {"extractor": "model", "slots": [{"name": "s", "description": "x" * 301}]},
            "dialogue.slots[0].description: must be a string of at most 300",
        ),
        (
            {"extractor": "rules", "slots": [{"name": "s", "description": "an order"}]},
            "dialogue.slots[0]: needs patterns or values (or extractor: model)",
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


MODEL_CONFIG = {
    "extractor": "model",
    "intents": [
        {"name": "refund", "description": "wants their money back"},
        {"name": "track", "keywords": ["where is"]},
    ],
    "slots": [{"name": "order", "description": "the order number"}, {"name": "qty"}],
}


def test_a_model_extractor_needs_only_names_and_tells_the_model_them():
    assert dialogue_config_problem(MODEL_CONFIG) is None
    extractor = extractor_for(MODEL_CONFIG)
    assert extractor.by_model and not extractor_for(CONFIG).by_model
    prompt = model_instructions(extractor)
    assert (
        "- refund: wants their money back\n- track\nSlots:\n- order: the order number\n- qty"
        in prompt
    )
    text = model_input({"intent": "track", "slots": {"order": "SO-1"}, "seq": 4}, [(5, "undo it")])
    assert text == (
        'State so far: {"intent": "track", "slots": {"order": "SO-1"}}\n\n'
        "New user message(s):\nundo it"
    )


@pytest.mark.parametrize(
    ("answer", "intent", "slots"),
    [
        (
            '```json\n{"intent": "refund", "slots": {"order": "SO-9"}}\n```',
            "refund",
            {"order": "SO-9", "x": "1"},
        ),
        ('{"intent": null, "slots": {"qty": 3}}', "track", {"order": "SO-1", "qty": "3", "x": "1"}),
        # Undeclared names, a boolean, an empty value and a list are dropped.
        (
            '{"intent": "cancel", "slots": {"colour": "red", "qty": true, "order": " ", "x": []}}',
            "track",
            {"order": "SO-1", "x": "1"},
        ),
        (
            '{"intent": "refund", "slots": {"order": "' + "9" * 500 + '"}}',
            "refund",
            {"order": "9" * SLOT_VALUE_MAX_CHARS, "x": "1"},
        ),
    ],
)
def test_the_models_answer_keeps_only_declared_names(answer, intent, slots):
    previous = {"intent": "track", "intent_turn": 1, "slots": {"order": "SO-1", "x": "1"}, "seq": 4}
    state = state_from_model(extractor_for(MODEL_CONFIG), previous, [(6, "...")], answer, turn=2)
    assert state is not None
    assert (state["intent"], state["slots"], state["seq"], state["turn"]) == (intent, slots, 6, 2)
    assert state["intent_turn"] == (2 if intent != "track" else 1)


@pytest.mark.parametrize("answer", ["", "Sure! The intent is refund.", "{not json}", "[1, 2]"])
def test_an_answer_that_is_not_the_json_asked_for_is_none(answer):
    assert state_from_model(extractor_for(MODEL_CONFIG), None, [(1, "x")], answer, turn=1) is None
