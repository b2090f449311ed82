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

    def holds(self, text: str, folded: str) -> bool:
        return any(k in folded for k in self.keywords) or any(p.search(text) for p in self.patterns)


@dataclass(frozen=True)
class _Slot:
    name: str
    patterns: tuple[re.Pattern[str], ...]
    values: tuple[tuple[str, tuple[str, ...]], ...]  # (canonical, folded synonyms)

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


def _parse(config: Any) -> Extractor:
    if config in (None, {}):
        return Extractor((), ())
    if not isinstance(config, dict):
        raise DialogueConfigError("dialogue", "must be a mapping with intents and slots")
    unknown = sorted(set(config) - {"intents", "slots"})
    if unknown:
        raise DialogueConfigError(f"dialogue.{unknown[0]}", "unknown key (use intents, slots)")
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
        extra = sorted(set(entry) - {"name", "keywords", "patterns"})
        if extra:
            raise DialogueConfigError(f"{path}.{extra[0]}", "unknown key (use keywords, patterns)")
        keywords = _strings(entry.get("keywords"), f"{path}.keywords")
        patterns = _compile(_strings(entry.get("patterns"), f"{path}.patterns"), f"{path}.patterns")
        if not keywords and not patterns:
            raise DialogueConfigError(path, "needs keywords or patterns")
        intents.append(_Intent(name, tuple(k.casefold() for k in keywords), patterns))
    seen = set()
    for i, entry in enumerate(raw_slots):
        path = f"dialogue.slots[{i}]"
        name = _name(entry, path, seen)
        extra = sorted(set(entry) - {"name", "patterns", "values"})
        if extra:
            raise DialogueConfigError(f"{path}.{extra[0]}", "unknown key (use patterns, values)")
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
        if not patterns and not values:
            raise DialogueConfigError(path, "needs patterns or values")
        slots.append(_Slot(name, patterns, tuple(values)))
    return Extractor(tuple(intents), tuple(slots))


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
