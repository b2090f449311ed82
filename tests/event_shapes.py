"""Checks an event's payload against its TypedDict in record/events.py (tests only).

The engine never validates payloads at run time (the step path stays cheap);
the suite checks every event it writes instead (see tests/conftest.py).
"""

import types
import typing
from typing import Any, Union, get_args, get_origin, get_type_hints

from record.events import PAYLOADS, EventType


def payload_problems(type_: str, data: Any) -> list[str]:
    """What is wrong with `data` as the payload of an event of `type_` (empty: nothing)."""
    try:
        event_type = EventType(type_)
    except ValueError:
        return [f"unknown event type {type_!r}"]
    return _problems(PAYLOADS[event_type], data, event_type.value)


def _problems(expected: Any, value: Any, where: str) -> list[str]:
    if expected is Any:
        return []
    if typing.is_typeddict(expected):
        if not isinstance(value, dict):
            return [f"{where}: expected an object, got {type(value).__name__}"]
        hints = get_type_hints(expected)
        problems = [
            f"{where}: missing {k!r}" for k in sorted(expected.__required_keys__ - value.keys())
        ]
        problems += [f"{where}: unexpected key {k!r}" for k in sorted(value.keys() - hints.keys())]
        for key, item in value.items():
            if key in hints:
                problems += _problems(hints[key], item, f"{where}.{key}")
        return problems
    origin = get_origin(expected)
    if origin in (Union, types.UnionType):
        options = [_problems(option, value, where) for option in get_args(expected)]
        return [] if any(not o for o in options) else min(options, key=len)
    if expected is type(None):
        return [] if value is None else [f"{where}: expected null, got {value!r}"]
    if origin is list:
        if not isinstance(value, list):
            return [f"{where}: expected a list, got {type(value).__name__}"]
        (item_type,) = get_args(expected)
        return [
            p for i, item in enumerate(value) for p in _problems(item_type, item, f"{where}[{i}]")
        ]
    if origin is dict:
        if not isinstance(value, dict):
            return [f"{where}: expected an object, got {type(value).__name__}"]
        _, item_type = get_args(expected)
        return [p for k, item in value.items() for p in _problems(item_type, item, f"{where}.{k}")]
    if expected is int:
        # JSON has one number type; a bool is not a count.
        ok = isinstance(value, int) and not isinstance(value, bool)
        return [] if ok else [f"{where}: expected an integer, got {value!r}"]
    if isinstance(expected, type):
        ok = isinstance(value, expected)
        return [] if ok else [f"{where}: expected {expected.__name__}, got {value!r}"]
    raise TypeError(f"{where}: the validator does not know {expected!r}")
