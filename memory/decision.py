"""What a new memory does to what the owner already has: add, update, delete or keep.

Two deciders answer the same question:
- the cheap model, shown the owner's nearest live items and the turn, answers the
  documented JSON (`DECISIONS_SCHEMA`: a list of `{"action", "target", "content",
  "subject"}`), checked here against the schema and against the items it was shown;
- `rule_decide`, when no model is available or its answer is invalid: the same
  subject, a sentence of the same shape with another value ("I prefer tea" -> "I
  prefer coffee"), a negation of a live item, or a near-duplicate updates that item;
  the same text keeps it; anything else is added.

Pure Python (no database), so both are unit-tested directly.
"""

import json
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from jsonschema import Draft202012Validator

from .extraction import subject_of

Action = Literal["add", "update", "delete", "keep"]
ACTIONS: tuple[Action, ...] = ("add", "update", "delete", "keep")

# Cosine similarity above which a new item is the same memory said again.
DUPLICATE_THRESHOLD = 0.9
MAX_DECISIONS = 20


@dataclass(frozen=True)
class Neighbour:
    """A live item of the owner the decider is shown."""

    id: int
    content: str
    subject: str
    tag: str
    similarity: float
    updated_at: datetime


@dataclass(frozen=True)
class Decision:
    action: Action
    target: int | None  # the item updated, deleted or kept; None for add
    content: str  # the item's text after the change (add, update)
    subject: str
    reason: str = ""  # why, for the version row
    tag: str = ""  # "" keeps the target's tag (or "fact" for a new item)
    importance: float | None = None


# --- The model's answer --------------------------------------------------------

DECISION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "action": {"enum": list(ACTIONS)},
        "target": {"type": ["integer", "null"]},
        "content": {"type": "string", "maxLength": 2000},
        "subject": {"type": "string", "maxLength": 200},
        "tag": {"type": "string", "maxLength": 40},
        "importance": {"type": "number", "minimum": 0, "maximum": 1},
    },
    "required": ["action", "target", "content", "subject"],
    "additionalProperties": False,
}
DECISIONS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"memories": {"type": "array", "items": DECISION_SCHEMA, "maxItems": 20}},
    "required": ["memories"],
    "additionalProperties": False,
}

DECISION_PROMPT = (
    "You maintain a user's long-term memory. You are given the memories already kept "
    "(each with its id) and the latest conversation turn. List what the turn changes, one "
    "entry per change: stable preferences, facts about the user, agreements, business "
    "conclusions; skip small talk and anything only relevant now.\n"
    "For each entry choose an action:\n"
    '- "add": something new; target null.\n'
    '- "update": the turn changes or refines a kept memory (a new value for the same '
    'thing, e.g. "favourite colour: blue" after "red"); target is its id, content the '
    "full new text.\n"
    '- "delete": the turn says a kept memory is no longer true and gives no new value; '
    "target is its id.\n"
    '- "keep": the turn repeats a kept memory; target is its id.\n'
    '`subject` names what the memory is about, short and stable ("favourite colour", '
    '"home city"), the same words as the kept memory it updates. Use only the ids listed. '
    'Answer with JSON only: {"memories": [{"action": "add"|"update"|"delete"|"keep", '
    '"target": id or null, "content": str, "subject": str, "tag"?: "preference"|"fact"|'
    '"agreement"|"business conclusion", "importance"?: 0..1}]}. '
    'An empty list is a fine answer: {"memories": []}.'
)


def decision_input(
    neighbours: list[Neighbour], transcript: str, fresh: frozenset[int] = frozenset()
) -> str:
    """The user message of the decision call: the kept memories (those stored during this
    turn marked), then the turn."""
    kept = [
        {
            "id": n.id,
            "subject": n.subject,
            "content": n.content,
            "tag": n.tag,
            **({"written_this_turn": True} if n.id in fresh else {}),
        }
        for n in neighbours
    ]
    return (
        "Kept memories:\n"
        + json.dumps(kept, ensure_ascii=False)
        + "\n\nThe conversation turn:\n"
        + transcript
    )


_VALIDATOR = Draft202012Validator(DECISIONS_SCHEMA)


def parse_decisions(text: str, shown: set[int]) -> tuple[list[Decision] | None, str]:
    """The model's answer as decisions, or (None, what is wrong) when it is not valid.

    1. JSON (a code fence around it is forgiven), valid against DECISIONS_SCHEMA.
    2. Each entry makes sense: update/delete/keep name an item the model was shown
       (never another owner's, never an invented id); add and update carry content.
    One bad entry makes the whole answer invalid: the caller falls back to the rules.
    """
    cleaned = text.strip()
    if cleaned.startswith("```"):
        cleaned = cleaned.strip("`")
        cleaned = cleaned[cleaned.find("\n") + 1 :] if "\n" in cleaned else cleaned
    try:
        value = json.loads(cleaned)
    except json.JSONDecodeError as exc:
        return None, f"not JSON ({exc.msg})"
    errors = sorted(_VALIDATOR.iter_errors(value), key=lambda e: list(map(str, e.path)))
    if errors:
        where = "/".join(map(str, errors[0].absolute_path)) or "(top)"
        return None, f"{where}: {errors[0].message}"
    decisions: list[Decision] = []
    for i, entry in enumerate(value["memories"]):
        action: Action = entry["action"]
        target = entry["target"]
        content = entry["content"].strip()
        if action == "add":
            target = None
        elif target not in shown:
            return None, f"memories/{i}: target {target} is not one of the items shown"
        if action in ("add", "update") and not content:
            return None, f"memories/{i}: {action} needs content"
        decisions.append(
            Decision(
                action=action,
                target=target,
                content=content,
                subject=normal_subject(entry["subject"]) or subject_of(content),
                reason=f"model: {action}",
                tag=str(entry.get("tag") or "")[:40],
                importance=entry.get("importance"),
            )
        )
    return decisions, ""


# --- The rules -----------------------------------------------------------------


def normal_subject(subject: str) -> str:
    return " ".join(subject.lower().split())[:200]


_WORD = re.compile(r"[^\W_]+(?:'[^\W_]+)?", re.UNICODE)
# Statements of which one holds at a time: a second one with another value replaces the first.
# "I like tea" and "I like coffee" (or "I always ...") can both be true, so those are not here.
_EXCLUSIVE_LEADS = (
    ("i", "prefer"),
    ("i", "would", "rather"),
    ("i'd", "rather"),
)
# Words that date a statement without changing what it is about.
_FILLER = frozenset({"now", "actually", "really", "currently", "nowadays", "instead"})
_NEGATIONS = frozenset({"not", "no", "never", "don't", "dont", "doesn't", "longer", "anymore"})
MAX_VALUE_WORDS = 3


def _words(text: str) -> list[str]:
    return [w for w in _WORD.findall(text.lower()) if w not in _FILLER]


def _lead(words: list[str]) -> tuple[str, ...] | None:
    for lead in _EXCLUSIVE_LEADS:
        if tuple(words[: len(lead)]) == lead:
            return lead
    return None


def same_shape(new: str, old: str) -> bool:
    """Two statements of an exclusive kind that differ only in a short value.

    "I prefer window seats" / "I prefer aisle seats": the same lead ("I prefer"), the
    same words around one differing span of at most MAX_VALUE_WORDS words on each side.
    """
    a, b = _words(new), _words(old)
    lead = _lead(a)
    if lead is None or lead != _lead(b) or a == b:
        return False
    prefix = 0
    while prefix < min(len(a), len(b)) and a[prefix] == b[prefix]:
        prefix += 1
    suffix = 0
    while (
        suffix < min(len(a), len(b)) - prefix and a[len(a) - 1 - suffix] == b[len(b) - 1 - suffix]
    ):
        suffix += 1
    changed_a, changed_b = len(a) - prefix - suffix, len(b) - prefix - suffix
    return (
        prefix >= len(lead)
        and 0 < max(changed_a, changed_b) <= MAX_VALUE_WORDS
        and min(changed_a, changed_b) > 0
    )


def negates(new: str, old: str) -> bool:
    """`new` is `old` with a negation added ("I no longer like tea" after "I like tea")."""
    a, b = _words(new), _words(old)
    if not any(w in _NEGATIONS for w in a) or any(w in _NEGATIONS for w in b):
        return False
    rest = [w for w in a if w not in _NEGATIONS and w not in ("do", "does", "any")]
    return len(b) >= 2 and rest == b


def _same_text(a: str, b: str) -> bool:
    return " ".join(a.lower().split()) == " ".join(b.lower().split())


def rule_decide(
    *, content: str, subject: str, neighbours: list[Neighbour], current: Neighbour | None
) -> Decision:
    """The deterministic decision for one new memory.

    1. A live item of the same subject (`current`): the same text keeps it, another
       text updates it.
    2. A neighbour of the same shape with another value, or one the new text negates
       (and whose subject does not differ): update it.
    3. A near-duplicate (cosine >= DUPLICATE_THRESHOLD, no conflicting subject): the same
       text keeps it, else it takes the newer wording.
    4. Else add.
    """
    if current is not None:
        if _same_text(current.content, content):
            return Decision("keep", current.id, content, subject, "the same text")
        return Decision("update", current.id, content, subject, f"same subject: {subject}")
    compatible = [n for n in neighbours if not n.subject or not subject or n.subject == subject]
    for n in compatible:
        if _same_text(n.content, content):
            return Decision("keep", n.id, content, subject or n.subject, "the same text")
    for n in compatible:
        if same_shape(content, n.content):
            return Decision(
                "update", n.id, content, subject or n.subject, "the same statement, a new value"
            )
        if negates(content, n.content):
            return Decision("update", n.id, content, subject or n.subject, "no longer true")
    for n in compatible:
        if n.similarity >= DUPLICATE_THRESHOLD:
            return Decision(
                "update",
                n.id,
                content,
                subject or n.subject,
                f"near-duplicate (cosine {n.similarity:.2f})",
            )
    return Decision("add", None, content, subject, "new")
