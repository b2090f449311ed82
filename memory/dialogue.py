"""Dialogue state (runtime-mechanisms §2.2): the user's intent and slots, extracted per user
turn by a deterministic extractor the agent declares, and carried over turns.

The model then reads a short structured line (`intent: refund; order: "SO-1001"`) instead
of having to re-derive, from the whole conversation, what the user wants and about what.

An agent's `dialogue` config::

    {"intents": [{"name": "refund", "keywords": ["refund", "money back"],
                  "patterns": ["(?i)\\\\bgive (it|them) back\\\\b"]}],
     "slots": [{"name": "order", "patterns": ["\\\\b(SO-\\\\d+)\\\\b"]},
               {"name": "carrier", "values": {"SF": ["sf express", "顺丰"], "DHL": ["dhl"]}}]}

- An intent holds when one of its keywords occurs in the text (case-insensitive) or one
  of its patterns is found; the first intent in the list that holds wins. A text that
  matches no intent keeps the previous intent (an answer such as "SO-1002" continues it).
- A slot takes the value of its first pattern found (the group named `value`, else the
  first group, else the whole match), or the canonical name of the first of its `values`
  whose synonym occurs (case-insensitive). A slot keeps its value until a later text sets
  another one. Values are cut to `SLOT_VALUE_MAX_CHARS`.

With `"extractor": "model"` the agent's cheap model (else its model) reads each user
message instead, told the declared names and their `description`s, and answers with JSON
(`model_instructions`, `state_from_model`): it understands paraphrases that no keyword
list foresees. An intent or slot then needs only a name (and preferably a description);
its keywords, patterns and values, if any, are the fallback when the model call fails or
answers nonsense, and what the offline `rules` model uses. Only declared names are kept.

Pure Python, no Django: the engine calls it, `configuration` validates with it.
"""

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, TypedDict

SLOT_VALUE_MAX_CHARS = 100
MAX_INTENTS = 50
MAX_SLOTS = 50
DESCRIPTION_MAX_CHARS = 300
EXTRACTORS = ("rules", "model")


class DialogueState(TypedDict, total=False):
    """What `Session.dialogue_state` holds."""

    intent: str | None
    intent_turn: int  # the turn the intent was last set
    slots: dict[str, str]
    slot_turns: dict[str, int]  # per slot, the turn it was last set
    turn: int  # the turn of the last update
    seq: int  # the last message (seq) the extractor read


@dataclass(frozen=True)
class _Intent:
    name: str
    keywords: tuple[str, ...]
    patterns: tuple[re.Pattern[str], ...]
    description: str = ""

    def holds(self, text: str, folded: str) -> bool:
        return any(k in folded for k in self.keywords) or any(p.search(text) for p in self.patterns)


@dataclass(frozen=True)
class _Slot:
    name: str
    patterns: tuple[re.Pattern[str], ...]
    values: tuple[tuple[str, tuple[str, ...]], ...]  # (canonical, folded synonyms)
    description: str = ""

    def find(self, text: str, folded: str) -> str | None:
        for pattern in self.patterns:
            found = pattern.search(text)
            if found is None:
                continue
            groups = found.groupdict()
            if groups.get("value") is not None:
                value = groups["value"]
            elif found.re.groups and found.group(1) is not None:
                value = found.group(1)
            else:
                value = found.group(0)
            value = value.strip()
            if value:
                return value[:SLOT_VALUE_MAX_CHARS]
        for canonical, synonyms in self.values:
            if any(s in folded for s in synonyms):
                return canonical
        return None


@dataclass(frozen=True)
class Extractor:
    intents: tuple[_Intent, ...]
    slots: tuple[_Slot, ...]
    by_model: bool = False

    @property
    def empty(self) -> bool:
        return not self.intents and not self.slots


class DialogueConfigError(ValueError):
    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.message = message


def _strings(value: Any, path: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise DialogueConfigError(path, "must be a list of non-empty strings")
    return list(value)


def _compile(patterns: list[str], path: str) -> tuple[re.Pattern[str], ...]:
    compiled = []
    for i, pattern in enumerate(patterns):
        try:
            compiled.append(re.compile(pattern))
        except re.error as exc:
            raise DialogueConfigError(
                f"{path}[{i}]", f"not a valid regular expression: {exc}"
            ) from None
    return tuple(compiled)


def _name(entry: Any, path: str, seen: set[str]) -> str:
    if not isinstance(entry, dict):
        raise DialogueConfigError(path, "must be a mapping with a name")
    name = entry.get("name")
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_][\w.-]{0,63}", name):
        raise DialogueConfigError(
            f"{path}.name", "must be a name of letters, digits, _ . - (at most 64)"
        )
    if name in seen:
        raise DialogueConfigError(f"{path}.name", f"duplicate name '{name}'")
    seen.add(name)
    return name


def _description(entry: dict[str, Any], path: str) -> str:
    value = entry.get("description", "")
    if not isinstance(value, str) or len(value) > DESCRIPTION_MAX_CHARS:
        raise DialogueConfigError(
            f"{path}.description", f"must be a string of at most {DESCRIPTION_MAX_CHARS} characters"
        )
    return value.strip()


def _parse(config: Any) -> Extractor:
    if config in (None, {}):
        return Extractor((), ())
    if not isinstance(config, dict):
        raise DialogueConfigError("dialogue", "must be a mapping with intents and slots")
    unknown = sorted(set(config) - {"extractor", "intents", "slots"})
    if unknown:
        raise DialogueConfigError(
            f"dialogue.{unknown[0]}", "unknown key (use extractor, intents, slots)"
        )
    mode = config.get("extractor", "rules")
    if mode not in EXTRACTORS:
        raise DialogueConfigError("dialogue.extractor", "must be rules or model")
    by_model = mode == "model"
    raw_intents, raw_slots = config.get("intents") or [], config.get("slots") or []
    if not isinstance(raw_intents, list) or len(raw_intents) > MAX_INTENTS:
        raise DialogueConfigError("dialogue.intents", f"must be a list of at most {MAX_INTENTS}")
    if not isinstance(raw_slots, list) or len(raw_slots) > MAX_SLOTS:
        raise DialogueConfigError("dialogue.slots", f"must be a list of at most {MAX_SLOTS}")
    intents, slots = [], []
    seen: set[str] = set()
    for i, entry in enumerate(raw_intents):
        path = f"dialogue.intents[{i}]"
        name = _name(entry, path, seen)
        extra = sorted(set(entry) - {"name", "keywords", "patterns", "description"})
        if extra:
            raise DialogueConfigError(
                f"{path}.{extra[0]}", "unknown key (use keywords, patterns, description)"
            )
        keywords = _strings(entry.get("keywords"), f"{path}.keywords")
        patterns = _compile(_strings(entry.get("patterns"), f"{path}.patterns"), f"{path}.patterns")
        if not keywords and not patterns and not by_model:
            raise DialogueConfigError(path, "needs keywords or patterns (or extractor: model)")
        intents.append(
            _Intent(
                name,
                tuple(k.casefold() for k in keywords),
                patterns,
                _description(entry, path),
            )
        )
    seen = set()
    for i, entry in enumerate(raw_slots):
        path = f"dialogue.slots[{i}]"
        name = _name(entry, path, seen)
        extra = sorted(set(entry) - {"name", "patterns", "values", "description"})
        if extra:
            raise DialogueConfigError(
                f"{path}.{extra[0]}", "unknown key (use patterns, values, description)"
            )
        patterns = _compile(_strings(entry.get("patterns"), f"{path}.patterns"), f"{path}.patterns")
        raw_values = entry.get("values") or {}
        if not isinstance(raw_values, dict):
            raise DialogueConfigError(
                f"{path}.values", "must map each canonical value to its synonyms"
            )
        values = []
        for canonical, synonyms in raw_values.items():
            words = _strings(synonyms, f"{path}.values.{canonical}")
            # The canonical spelling is a synonym of itself.
            values.append((str(canonical), tuple(w.casefold() for w in [canonical, *words])))
        if not patterns and not values and not by_model:
            raise DialogueConfigError(path, "needs patterns or values (or extractor: model)")
        slots.append(_Slot(name, patterns, tuple(values), _description(entry, path)))
    return Extractor(tuple(intents), tuple(slots), by_model)


def dialogue_config_problem(config: Any) -> str | None:
    """What is wrong with an agent's `dialogue` config (path: message), or None."""
    try:
        _parse(config)
    except DialogueConfigError as exc:
        return str(exc)
    return None


_compiled: dict[str, Extractor] = {}
_by_identity: dict[int, tuple[Any, Extractor]] = {}
_COMPILED_MAX = 256


def extractor_for(config: Any) -> Extractor:
    """The compiled extractor of a config, cached by its JSON text (an edit compiles anew);
    a broken config (only possible by bypassing apply_config) extracts nothing."""
    if not config:
        return Extractor((), ())
    # The same config object (an agent cached by the engine between its edits): no re-encoding.
    known = _by_identity.get(id(config))
    if known is not None and known[0] is config:
        return known[1]
    key = json.dumps(config, sort_keys=True, default=str)
    found = _compiled.get(key)
    if found is None:
        try:
            found = _parse(config)
        except DialogueConfigError:
            found = Extractor((), ())
        if len(_compiled) >= _COMPILED_MAX:
            _compiled.clear()
        _compiled[key] = found
    if len(_by_identity) >= _COMPILED_MAX:
        _by_identity.clear()
    # Holding the config keeps its id from being reused by another object.
    _by_identity[id(config)] = (config, found)
    return found


def extract(
    extractor: Extractor,
    previous: DialogueState | dict[str, Any] | None,
    texts: Iterable[tuple[int, str]],
    *,
    turn: int,
) -> DialogueState:
    """The state after reading `texts` ((seq, text), oldest first) in `turn`.

    Slots and the intent carry over from `previous` until a text sets them again.
    """
    before = previous or {}
    state: DialogueState = {
        "intent": before.get("intent"),
        "intent_turn": int(before.get("intent_turn") or 0),
        "slots": dict(before.get("slots") or {}),
        "slot_turns": dict(before.get("slot_turns") or {}),
        "turn": turn,
        "seq": int(before.get("seq") or 0),
    }
    for seq, text in texts:
        state["seq"] = max(state["seq"], seq)
        folded = text.casefold()
        for intent in extractor.intents:
            if intent.holds(text, folded):
                state["intent"], state["intent_turn"] = intent.name, turn
                break
        for slot in extractor.slots:
            value = slot.find(text, folded)
            if value is not None:
                state["slots"][slot.name] = value
                state["slot_turns"][slot.name] = turn
    return state


# --- The model extractor -------------------------------------------------------------

MODEL_ANSWER_SHAPE = '{"intent": "<one intent name>" or null, "slots": {"<slot name>": "<value>"}}'


def model_instructions(extractor: Extractor) -> str:
    """The system prompt of a dialogue-state call: the declared names, nothing else."""
    lines = [
        "You track the state of a conversation for an assistant. Read the user's new "
        "message(s) and answer with one JSON object and nothing else:",
        MODEL_ANSWER_SHAPE,
        "- intent: what the user wants now, as one of the intent names below; null when the "
        "message does not change it (for example it only answers a question).",
        "- slots: only slots the new message(s) give a value for, with the value as the user "
        "gave it (ids and numbers exact); leave out the others.",
        "Intents:",
    ]
    lines += [
        f"- {i.name}: {i.description}" if i.description else f"- {i.name}"
        for i in extractor.intents
    ] or ["(none)"]
    lines.append("Slots:")
    lines += [
        f"- {s.name}: {s.description}" if s.description else f"- {s.name}" for s in extractor.slots
    ] or ["(none)"]
    return "\n".join(lines)


def model_input(
    previous: DialogueState | dict[str, Any] | None, texts: Iterable[tuple[int, str]]
) -> str:
    """The user message of a dialogue-state call: the state so far and the new text(s)."""
    before = previous or {}
    known = {"intent": before.get("intent"), "slots": dict(before.get("slots") or {})}
    new = "\n".join(text[:4000] for _, text in texts)
    return (
        "State so far: "
        + json.dumps(known, ensure_ascii=False)
        + "\n\nNew user message(s):\n"
        + new
    )


def state_from_model(
    extractor: Extractor,
    previous: DialogueState | dict[str, Any] | None,
    texts: Iterable[tuple[int, str]],
    answer: str,
    *,
    turn: int,
) -> DialogueState | None:
    """The state after the model's answer, keeping only declared names; None when the
    answer is not the JSON asked for (the caller falls back to the declared rules)."""
    start, end = answer.find("{"), answer.rfind("}")
    if start < 0 or end <= start:
        return None
    try:
        parsed = json.loads(answer[start : end + 1])
    except ValueError:
        return None
    if not isinstance(parsed, dict):
        return None
    state = extract(Extractor((), ()), previous, texts, turn=turn)  # carry over, advance seq
    intent = parsed.get("intent")
    if isinstance(intent, str) and intent in {i.name for i in extractor.intents}:
        state["intent"], state["intent_turn"] = intent, turn
    slots = parsed.get("slots")
    names = {s.name for s in extractor.slots}
    for name, value in slots.items() if isinstance(slots, dict) else ():
        if name not in names or isinstance(value, bool) or not isinstance(value, (str, int, float)):
            continue
        text = str(value).strip()[:SLOT_VALUE_MAX_CHARS]
        if text:
            state["slots"][name] = text
            state["slot_turns"][name] = turn
    return state
