"""`approval_when`: a condition on a call's arguments, written as data, never `eval`.

    {"field": "amount", "op": "gt", "value": 50}
    {"any": [{"field": "amount", "op": "gte", "value": 500},
             {"all": [{"field": "customer.tier", "op": "eq", "value": "new"},
                      {"field": "amount", "op": "gt", "value": 50}]}]}

`field` is a dotted path into the arguments (a number indexes a list). A
missing field, or a comparison between values of unlike types, is simply not
true: a malformed call is never gated by accident of a TypeError, and a
condition that could not be evaluated is refused when the config is applied.
"""

from collections.abc import Callable
from typing import Any

OPERATORS = ("eq", "ne", "gt", "gte", "lt", "lte", "in", "not_in", "contains", "exists")
# What people write in a YAML file; stored as given, read as the named operator.
ALIASES = {"==": "eq", "!=": "ne", ">": "gt", ">=": "gte", "<": "lt", "<=": "lte"}
MAX_DEPTH = 8
_MISSING = object()


class ConditionError(ValueError):
    """The condition is not well formed; `path` says where (e.g. `any[1].op`)."""

    def __init__(self, path: str, message: str) -> None:
        self.path = path
        self.message = message
        super().__init__(f"{path}: {message}" if path else message)


def validate(condition: Any, path: str = "", depth: int = 0) -> None:
    """Raise ConditionError unless `condition` is a well-formed condition (None: no condition)."""
    if condition is None or (path == "" and condition == {}):
        return
    if depth > MAX_DEPTH:
        raise ConditionError(path, f"nested deeper than {MAX_DEPTH} levels")
    if not isinstance(condition, dict):
        raise ConditionError(path, "a condition must be an object")
    groups = [k for k in ("all", "any") if k in condition]
    if groups:
        if len(condition) != 1:
            raise ConditionError(path, "an all/any group has no other keys")
        key = groups[0]
        parts = condition[key]
        if not isinstance(parts, list) or not parts:
            raise ConditionError(f"{path}{key}".lstrip("."), "must be a non-empty list")
        for i, part in enumerate(parts):
            validate(part, f"{path}{key}[{i}].", depth + 1)
        return
    unknown = set(condition) - {"field", "op", "value"}
    if unknown:
        raise ConditionError(path, f"unknown key(s) {', '.join(sorted(unknown))}")
    field = condition.get("field")
    if not isinstance(field, str) or not field or any(not p for p in field.split(".")):
        raise ConditionError(
            f"{path}field", "must be a dotted path such as amount or customer.tier"
        )
    raw_op = condition.get("op")
    op = ALIASES.get(raw_op, raw_op) if isinstance(raw_op, str) else raw_op
    if op not in OPERATORS:
        raise ConditionError(f"{path}op", f"must be one of {', '.join(OPERATORS)}")
    if op == "exists":
        if not isinstance(condition.get("value", True), bool):
            raise ConditionError(f"{path}value", "exists takes true or false")
        return
    if "value" not in condition:
        raise ConditionError(f"{path}value", f"{op} needs a value")
    value = condition["value"]
    if op in ("in", "not_in") and not isinstance(value, list):
        raise ConditionError(f"{path}value", f"{op} needs a list")
    if op in ("gt", "gte", "lt", "lte") and not (_number(value) or isinstance(value, str)):
        raise ConditionError(f"{path}value", f"{op} compares with a number or a string")


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _lookup(arguments: Any, field: str) -> Any:
    current = arguments
    for part in field.split("."):
        if isinstance(current, dict):
            current = current.get(part, _MISSING)
        elif isinstance(current, list) and part.lstrip("-").isdigit():
            index = int(part)
            current = current[index] if -len(current) <= index < len(current) else _MISSING
        else:
            return _MISSING
        if current is _MISSING:
            return _MISSING
    return current


def _ordered(op: Callable[[Any, Any], bool]) -> Callable[[Any, Any], bool]:
    def compare(found: Any, value: Any) -> bool:
        if _number(found) and _number(value):
            return op(found, value)
        if isinstance(found, str) and isinstance(value, str):
            return op(found, value)
        return False

    return compare


def _same(a: Any, b: Any) -> bool:
    # JSON true is not the number 1.
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    return bool(a == b)


def _contains(found: Any, value: Any) -> bool:
    if isinstance(found, str):
        return isinstance(value, str) and value in found
    if isinstance(found, list):
        return value in found
    if isinstance(found, dict):
        return isinstance(value, str) and value in found
    return False


_COMPARE: dict[str, Callable[[Any, Any], bool]] = {
    "eq": lambda a, b: _same(a, b),
    "ne": lambda a, b: not _same(a, b),
    "gt": _ordered(lambda a, b: a > b),
    "gte": _ordered(lambda a, b: a >= b),
    "lt": _ordered(lambda a, b: a < b),
    "lte": _ordered(lambda a, b: a <= b),
    "in": lambda a, b: any(_same(a, x) for x in b),
    "not_in": lambda a, b: not any(_same(a, x) for x in b),
    "contains": _contains,
}


def evaluate(condition: Any, arguments: Any) -> bool:
    """True when the (validated) condition holds for these arguments; no condition is False."""
    if not condition:
        return False
    if "all" in condition:
        return all(evaluate(part, arguments) for part in condition["all"])
    if "any" in condition:
        return any(evaluate(part, arguments) for part in condition["any"])
    op = ALIASES.get(condition["op"], condition["op"])
    found = _lookup(arguments, condition["field"])
    if op == "exists":
        return (found is not _MISSING) == bool(condition.get("value", True))
    if found is _MISSING:
        return False
    return _COMPARE[op](found, condition["value"])
