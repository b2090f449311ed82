"""Deciding what a new memory does: the model's JSON answer checked, and the rules."""

from datetime import UTC, datetime

from memory.decision import (
    DECISION_PROMPT,
    Neighbour,
    decision_input,
    negates,
    parse_decisions,
    rule_decide,
    same_shape,
)

AT = datetime(2026, 11, 20, tzinfo=UTC)


def _n(id: int, content: str, subject: str = "", similarity: float = 0.3) -> Neighbour:  # noqa: A002
    return Neighbour(id, content, subject, "preference", similarity, AT)


def test_a_valid_answer_becomes_decisions_naming_only_items_shown():
    text = (
        '{"memories": [{"action": "update", "target": 7, "content": "Favourite colour: blue", '
        '"subject": "Favourite  Colour", "tag": "preference"}, {"action": "add", "target": null, '
        '"content": "Works at Acme", "subject": "employer", "importance": 0.7}, '
        '{"action": "delete", "target": 8, "content": "", "subject": "diet"}]}'
    )
    decisions, problem = parse_decisions(text, {7, 8})
    assert problem == "" and decisions is not None
    assert [(d.action, d.target, d.subject) for d in decisions] == [
        ("update", 7, "favourite colour"),
        ("add", None, "employer"),
        ("delete", 8, "diet"),
    ]
    assert decisions[1].importance == 0.7
    # A fenced answer is forgiven; an empty list is a fine answer.
    assert parse_decisions('```json\n{"memories": []}\n```', set()) == ([], "")


def test_an_invalid_answer_is_refused_whole():
    shown = {7}
    for text, why in [
        ("Sure, I'll update the colour.", "not JSON"),
        ('{"items": []}', "memories"),  # the old extraction shape
        (
            '{"memories": [{"action": "merge", "target": 7, "content": "x", "subject": ""}]}',
            "merge",
        ),
        ('{"memories": [{"action": "update", "content": "x", "subject": ""}]}', "target"),
        # An id the model was not shown: invented, or another owner's item.
        ('{"memories": [{"action": "update", "target": 99, "content": "x", "subject": ""}]}', "99"),
        (
            '{"memories": [{"action": "update", "target": 7, "content": " ", "subject": ""}]}',
            "content",
        ),
    ]:
        decisions, problem = parse_decisions(text, shown)
        assert decisions is None and why in problem, (text, problem)


def test_the_prompt_documents_the_answer_and_shows_ids():
    assert '"action": "add"|"update"|"delete"|"keep"' in DECISION_PROMPT
    shown = decision_input([_n(7, "My favourite colour is red", "favourite colour")], "user: hi")
    assert '"id": 7' in shown and "user: hi" in shown


def test_the_same_subject_updates_the_live_item_or_keeps_the_same_text():
    current = _n(3, "My favourite colour is red", "favourite colour")
    changed = rule_decide(
        content="my favorite color is blue",
        subject="favourite colour",
        neighbours=[],
        current=current,
    )
    assert (changed.action, changed.target) == ("update", 3)
    again = rule_decide(
        content="My favourite  colour is RED",
        subject="favourite colour",
        neighbours=[],
        current=current,
    )
    assert (again.action, again.target) == ("keep", 3)


def test_a_changed_preference_without_a_subject_updates_the_old_one():
    # The hashing embedder finds these far apart; the shape of the sentence does not.
    tea = _n(4, "I prefer tea", similarity=0.2)
    coffee = rule_decide(content="I now prefer coffee", subject="", neighbours=[tea], current=None)
    assert (coffee.action, coffee.target) == ("update", 4)
    assert same_shape("I prefer aisle seats", "I prefer window seats")
    # Likes add up, and a long different tail is another statement.
    assert not same_shape("I like coffee", "I like tea")
    assert not same_shape("I prefer tea in the morning", "I prefer coffee in the evening")
    liked = rule_decide(
        content="I like coffee", subject="", neighbours=[_n(5, "I like tea")], current=None
    )
    assert liked.action == "add"


def test_a_negation_updates_and_a_near_duplicate_takes_the_newer_wording():
    assert negates("I don't like tea anymore", "I like tea")
    assert negates("I no longer like tea", "I like tea")
    assert not negates("I like tea", "I don't like tea")
    no_tea = rule_decide(
        content="I no longer like tea", subject="", neighbours=[_n(5, "I like tea")], current=None
    )
    assert (no_tea.action, no_tea.target) == ("update", 5)
    twin = _n(6, "I like espresso", similarity=0.95)
    merged = rule_decide(content="I love espresso", subject="", neighbours=[twin], current=None)
    assert (merged.action, merged.target) == ("update", 6)
    # A near-duplicate about another subject stays apart.
    other = _n(6, "My home city is Paris", "home city", similarity=0.95)
    apart = rule_decide(
        content="My birth city is Paris", subject="birth city", neighbours=[other], current=None
    )
    assert apart.action == "add"
