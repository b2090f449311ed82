"""Reading one mapping of a workflow's config, recording a problem per wrong field.

A config file is fixed in one go only if it names every problem at once, so nothing here
raises: each reader returns None (or the default) for a wrong field and records a message
in the style of the project's config errors, `<path>.<field>: <what is wrong>`.
"""

import json
import re
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from workflows.expressions import (
    Expression,
    ExpressionError,
    Template,
    expression_compile,
    template_compile,
)


def unknown(what: str, value: str, known: Collection[str]) -> str:
    """`unknown tool 'x' (known: a, b)`: the one wording for every missing reference."""
    return f"unknown {what} '{value}' (known: {', '.join(sorted(known)) or 'none'})"


def type_name(value: Any) -> str:
    """How a message names a wrong value's type: YAML words, not Python's."""
    if value is None:
        return "null"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    return type(value).__name__


class FieldReader:
    """The fields of one config mapping (a workflow, a node, a case), read leniently."""

    def __init__(self, raw: Mapping[str, Any], path: str, problems: list[str]) -> None:
        self.raw = raw
        self.path = path
        self.problems = problems

    def has(self, name: str) -> bool:
        return self.raw.get(name) is not None

    def problem(self, name: str, message: str) -> None:
        self.problems.append(f"{self.path}.{name}: {message}")

    def only(
        self, allowed: Sequence[str], what: str, *, judged_elsewhere: Sequence[str] = ()
    ) -> None:
        """A problem for each field not in `allowed` (or `judged_elsewhere`, which has its own
        message): a misspelt key is never ignored."""
        for key in self.raw:
            if key not in allowed and key not in judged_elsewhere:
                self.problem(str(key), f"unknown field for {what} (allowed: {', '.join(allowed)})")

    def require(self, names: Sequence[str], what: str) -> bool:
        """A problem for each of `names` that is absent (or null); True when all are there."""
        missing = [name for name in names if not self.has(name)]
        for name in missing:
            self.problem(name, f"required for {what}")
        return not missing

    def text(self, name: str, *, empty_ok: bool = False) -> str | None:
        """A string field (non-empty unless `empty_ok`)."""
        value = self.raw.get(name)
        if value is None:
            return None
        if not isinstance(value, str):
            self.problem(name, f"must be a string, not {type_name(value)}")
            return None
        if not value.strip() and not empty_ok:
            self.problem(name, "must not be empty")
            return None
        return value

    def matching(self, name: str, pattern: re.Pattern[str], description: str) -> str | None:
        """A string field that must match `pattern` (an id, a slug, a state key)."""
        value = self.text(name)
        if value is not None and not pattern.fullmatch(value):
            self.problem(name, f"'{value}' is not {description}")
            return None
        return value

    def known(self, name: str, known: Collection[str], what: str) -> str | None:
        """A string field naming one of `known` (a tool, an agent, a model)."""
        value = self.text(name)
        if value is not None and value not in known:
            self.problem(name, unknown(what, value, known))
            return None
        return value

    def option(self, name: str, allowed: Sequence[str], default: str) -> str:
        """A field with a fixed set of values."""
        value = self.raw.get(name)
        if value is None:
            return default
        if value not in allowed:
            self.problem(name, f"must be one of {', '.join(allowed)}, not {value!r}")
            return default
        return str(value)

    def number(self, name: str, *, minimum: float, exclusive: bool = False) -> float | None:
        """A number field at least (or, `exclusive`, above) `minimum`."""
        value = self.raw.get(name)
        if value is None:
            return None
        bound = f"> {minimum:g}" if exclusive else f">= {minimum:g}"
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.problem(name, f"must be a number {bound}, not {type_name(value)}")
            return None
        if value < minimum or (exclusive and value == minimum):
            self.problem(name, f"must be a number {bound}, not {value}")
            return None
        return float(value)

    def integer(self, name: str, *, minimum: int, maximum: int | None = None) -> int | None:
        """An integer field within [minimum, maximum]."""
        value = self.raw.get(name)
        if value is None:
            return None
        bounds = f"from {minimum} to {maximum}" if maximum is not None else f">= {minimum}"
        wrong_type = isinstance(value, bool) or not isinstance(value, int)
        if wrong_type or value < minimum or (maximum is not None and value > maximum):
            self.problem(name, f"must be an integer {bounds}, not {value!r}")
            return None
        return int(value)

    def mapping(self, name: str) -> Mapping[str, Any] | None:
        """A mapping field (keys as strings)."""
        value = self.raw.get(name)
        if value is None:
            return None
        if not isinstance(value, Mapping):
            self.problem(name, f"must be a mapping, not {type_name(value)}")
            return None
        return {str(k): v for k, v in value.items()}

    def expression(self, name: str) -> Expression | None:
        """A CEL expression field. A YAML number or boolean is taken as that CEL literal
        (`seconds: 30`); a string is CEL source (`'text'` needs CEL's own quotes)."""
        value = self.raw.get(name)
        if value is None:
            return None
        if isinstance(value, bool | int | float):
            value = json.dumps(value)
        if not isinstance(value, str):
            self.problem(name, f"must be a CEL expression (a string), not {type_name(value)}")
            return None
        try:
            return expression_compile(value)
        except ExpressionError as exc:
            self.problem(name, exc.message)
            return None

    def template(self, name: str) -> Template | None:
        """A text field with `{{ <CEL> }}` placeholders."""
        value = self.text(name)
        if value is None:
            return None
        try:
            return template_compile(value)
        except ExpressionError as exc:
            self.problem(name, exc.message)
            return None

    def schema(self, name: str) -> dict[str, Any] | None:
        """A JSON Schema field (draft 2020-12)."""
        value = self.mapping(name)
        if value is None:
            return None
        try:
            Draft202012Validator.check_schema(value)
        except SchemaError as exc:
            self.problem(name, f"not a valid JSON Schema: {exc.message}")
            return None
        return dict(value)
