"""Checking the model's tool arguments against the tool's JSON Schema.

Safe coercions are applied first and recorded ("42" to 42 for an integer, a
single value to a one-element array, a number to a string where a string is
asked). Whatever is still wrong comes back as one message listing every field
and what to send instead, for the model to fix.
"""

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError

MAX_ARGUMENT_BYTES = 64 * 1024
_INTEGER = re.compile(r"^[+-]?\d+$")
_NUMBER = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")

FORMAT_HINTS = {
    "date": "a date in YYYY-MM-DD format",
    "date-time": "a date and time in ISO 8601 format (YYYY-MM-DDTHH:MM:SSZ)",
    "email": "an email address",
    "uri": "an absolute URI",
    "uuid": "a UUID",
}
TYPE_NAMES = {
    "integer": "an integer",
    "number": "a number",
    "string": "a string",
    "boolean": "true or false",
    "array": "an array",
    "object": "an object",
    "null": "null",
}

BOUNDS = {
    "minimum": "be at least {}",
    "maximum": "be at most {}",
    "exclusiveMinimum": "be greater than {}",
    "exclusiveMaximum": "be less than {}",
    "minLength": "have at least {} characters",
    "maxLength": "have at most {} characters",
    "minItems": "have at least {} items",
    "maxItems": "have at most {} items",
    "pattern": "match the pattern {}",
}
SIZED = ("minLength", "maxLength", "minItems", "maxItems")


@dataclass
class CheckedArguments:
    arguments: dict[str, Any]
    coercions: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def compile_validator(schema: dict[str, Any]) -> Draft202012Validator:
    return Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)


def _path(parts: list[str | int]) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "arguments"


def _show(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 80 else text[:77] + "..."


def _coerce(value: Any, schema: Any, path: list[str | int], notes: list[str]) -> Any:
    if not isinstance(schema, dict):
        return value
    kind = schema.get("type")
    if kind == "integer" and isinstance(value, str) and _INTEGER.match(value.strip()):
        notes.append(f"{_path(path)}: {_show(value)} -> {int(value)}")
        return int(value)
    if (
        kind == "number"
        and isinstance(value, str)
        and _NUMBER.match(value.strip())
        and math.isfinite(float(value))
    ):
        number = float(value)
        number_out: int | float = (
            int(number) if number.is_integer() and "." not in value else number
        )
        notes.append(f"{_path(path)}: {_show(value)} -> {number_out}")
        return number_out
    if kind == "string" and isinstance(value, int | float) and not isinstance(value, bool):
        notes.append(f"{_path(path)}: {value} -> {_show(str(value))}")
        return str(value)
    if kind == "array":
        if value is not None and not isinstance(value, list):
            notes.append(f"{_path(path)}: single value -> one-element array")
            value = [value]
        if isinstance(value, list) and isinstance(schema.get("items"), dict):
            return [
                _coerce(item, schema["items"], [*path, i], notes) for i, item in enumerate(value)
            ]
        return value
    if kind == "object" and isinstance(value, dict):
        properties = schema.get("properties") or {}
        return {k: _coerce(v, properties.get(k), [*path, k], notes) for k, v in value.items()}
    return value


def describe(error: ValidationError) -> str:
    """One wrong field, said the way a person would fix it."""
    where = _path(list(error.absolute_path))
    validator, expected = error.validator, error.validator_value
    if validator == "required":
        missing = error.message.split("'")[1] if "'" in error.message else error.message
        prefix = f"{where}." if where != "arguments" else ""
        return f"{prefix}{missing} is required but missing"
    if validator == "type":
        wanted = expected if isinstance(expected, list) else [expected]
        return f"{where} must be {' or '.join(TYPE_NAMES.get(str(t), str(t)) for t in wanted)}; got {_show(error.instance)}"
    if validator == "format":
        return f"{where} must be {FORMAT_HINTS.get(str(expected), f'in {expected} format')}; got {_show(error.instance)}"
    if validator == "enum":
        return f"{where} must be one of {', '.join(_show(v) for v in expected)}; got {_show(error.instance)}"
    if validator == "additionalProperties":
        allowed = sorted((error.schema.get("properties") or {}).keys())
        extra = (
            sorted(set(error.instance) - set(allowed)) if isinstance(error.instance, dict) else []
        )
        return f"unexpected field(s) {', '.join(extra)} in {where}; allowed: {', '.join(allowed) or 'none'}"
    if validator in BOUNDS:
        # jsonschema's own message repeats the whole value; say the limit and show it short.
        got = len(error.instance) if validator in SIZED else _show(error.instance)
        return f"{where} must {BOUNDS[validator].format(expected)}; got {got}"
    return f"{where}: {error.message}"


def check_arguments(validator: Draft202012Validator, arguments: Any) -> CheckedArguments:
    """Coerce what is safe, then list every remaining problem at once."""
    if not isinstance(arguments, dict):
        return CheckedArguments(
            {}, errors=[f"arguments must be a JSON object; got {type(arguments).__name__}"]
        )
    size = len(json.dumps(arguments, ensure_ascii=False, default=str).encode())
    if size > MAX_ARGUMENT_BYTES:
        return CheckedArguments(
            {},
            errors=[
                f"arguments are {size} bytes; the limit is {MAX_ARGUMENT_BYTES}. Send less data."
            ],
        )
    notes: list[str] = []
    coerced = _coerce(arguments, validator.schema, [], notes)
    errors = sorted(validator.iter_errors(coerced), key=lambda e: [str(p) for p in e.absolute_path])
    return CheckedArguments(coerced, notes, [describe(e) for e in errors])
