"""CEL expressions and `{{ <CEL> }}` templates: compiled once, evaluated to plain JSON values.

CEL is the workflows' only expression language (safe, side-effect free, no `eval`). The cel
package (common-expression-language) compiles and runs it; this module turns its results and
errors into what the engine can store and show.

How values behave (cel 0.10):
- Numbers keep the Python type they were loaded with: JSON 60 is an int, 60.0 a double.
  Comparisons across int and double work (`order.total > 50` with a total of 60.5 is true,
  `60.0 == 60` is true); arithmetic does not (`order.total + 1` with a double total fails
  "Unsupported operation: float + int": write `order.total + 1.0` or `double(order.total)`).
- Results are plain JSON: ints, doubles, strings, bools, null, lists and maps as they are
  (map keys as strings); a uint as an int; a timestamp as an RFC 3339 string
  ("2024-01-01T00:00:00Z"); a duration as a number of seconds; an optional as its value or
  null. Bytes, NaN and infinities are refused: JSON cannot hold them.
"""

import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Any

import cel

from workflows.cel_cost import CostBound, cost_bound, extent
from workflows.cel_scan import free_names, placeholder_end
from workflows.limits import limits

# Names CEL resolves itself (type names and the optional namespace): never state keys.
CEL_BUILTIN_NAMES = frozenset(
    {"int", "uint", "double", "bool", "string", "bytes", "list", "map", "null_type", "type"}
    | {"dyn", "optional"}
)
# Words CEL's grammar keeps: an identifier spelled like one could not be read.
CEL_RESERVED_WORDS = frozenset(
    {"true", "false", "null", "in", "as", "break", "const", "continue", "else", "for"}
    | {"function", "if", "import", "let", "loop", "package", "namespace", "return"}
    | {"var", "void", "while"}
)
_SYNTAX_ERROR = re.compile(r"ERROR: <input>:(\d+):(\d+): (?:Syntax error: )?([^\n]*)")
# A parser limit comes as a Rust debug dump: `OtherError(ParseError { ..., msg: "...", ... })`.
_DEBUG_MESSAGE = re.compile(r'\bmsg: "((?:[^"\\]|\\.)*)"')
_QUOTED_MAX_CHARS = 80
_COMPILED_MAX = 4096


class ExpressionError(Exception):
    """An expression or template that does not compile: `message` is one readable line."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class EvaluationError(Exception):
    """An expression that failed at run time: `message` is one line naming the expression."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ExpressionLimitError(EvaluationError):
    """An expression that would cost more than EXPRESSION_COST_LIMIT over these inputs: it
    is refused before it runs (cel cannot be stopped once it has started)."""

    def __init__(self, message: str, source: str) -> None:
        super().__init__(message)
        self.source = source


class _NotJson(Exception):
    """A CEL value JSON cannot hold; its text says what it was."""


def _quoted(source: str) -> str:
    """The source on one line, shortened, quoted: messages stay one readable line."""
    text = " ".join(source.split())
    if len(text) > _QUOTED_MAX_CHARS:
        text = text[: _QUOTED_MAX_CHARS - 1] + "…"
    return repr(text)


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _syntax_message(source: str, error: ValueError) -> str:
    """cel's multi-line parse error as one line: the first error, its position, the source."""
    match = _SYNTAX_ERROR.search(str(error))
    if match is None:
        return f"CEL syntax error: {_one_line(str(error))}"
    line, column, detail = match.groups()
    if debug := _DEBUG_MESSAGE.search(detail):
        detail = debug.group(1)
    where = f"column {column}" if line == "1" else f"line {line}, column {column}"
    return f"CEL syntax error: {_one_line(detail)} ({where} of {_quoted(source)})"


def _failure_detail(error: Exception) -> str:
    """What went wrong, without the exception class's own noise (a KeyError's bare quotes)."""
    if isinstance(error, KeyError):
        return f"no such key: {error.args[0]!r}" if error.args else "no such key"
    return _one_line(str(error)) or type(error).__name__


def _plain_key(key: Any) -> str:
    if isinstance(key, str):
        return key
    if isinstance(key, bool):
        return "true" if key else "false"
    if isinstance(key, int):
        return str(key)
    raise _NotJson(f"a map key of type {type(key).__name__}")


def _plain_number(value: float) -> float:
    if not math.isfinite(value):
        raise _NotJson(f"a non-finite number ({value})")
    return value


def _plain_timestamp(value: datetime) -> str:
    if value.tzinfo is not None:
        value = value.astimezone(UTC)
    return value.replace(tzinfo=None).isoformat() + "Z"


def _plain_duration(value: timedelta) -> int | float:
    seconds = value.total_seconds()
    return int(seconds) if seconds.is_integer() else seconds


def _plain(value: Any) -> Any:
    """A CEL result as plain JSON types; raises _NotJson for what JSON cannot hold."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return _plain_number(value)
    if isinstance(value, Mapping):
        return {_plain_key(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, datetime):
        return _plain_timestamp(value)
    if isinstance(value, timedelta):
        return _plain_duration(value)
    if isinstance(value, cel.OptionalValue):
        return _plain(value.value()) if value.has_value() else None
    if isinstance(value, bytes):
        raise _NotJson("bytes (use string(...) to make text of them)")
    raise _NotJson(f"a value of type {type(value).__name__}")


@dataclass(frozen=True)
class Expression:
    """One compiled CEL expression and the state keys it reads.

    `names` drives the workflow's data-flow check; evaluation hands the program only the
    scope entries it can look up, so a large state is not converted on every call.
    """

    source: str
    names: frozenset[str]
    _program: cel.Program = field(compare=False, repr=False)
    _lookups: tuple[str, ...] = field(compare=False, repr=False, default=())
    _cost: CostBound | None = field(compare=False, repr=False, default=None)

    def evaluate(self, scope: Mapping[str, Any]) -> Any:
        """The expression's value over `scope`, as plain JSON types."""
        context = {name: scope[name] for name in self._lookups if name in scope}
        self.check_cost(context.values())
        return self._run(context)

    def check_cost(self, values: Iterable[Any]) -> None:
        """Refuse (ExpressionLimitError) to run over inputs that would make it cost more than
        EXPRESSION_COST_LIMIT; an expression without comprehensions is not measured."""
        if self._cost is None or not self._cost.loops:
            return
        units = self._cost.units(extent(values))
        limit = limits().expression_cost
        if units > limit:
            raise ExpressionLimitError(
                f"CEL expression {_quoted(self.source)} would cost up to {units:,} units over "
                f"these inputs, more than EXPRESSION_COST_LIMIT ({limit:,}): give it shorter "
                "lists or fewer nested comprehensions",
                self.source,
            )

    def _run(self, context: dict[str, Any] | cel.Context) -> Any:
        try:
            value = self._program.execute(context)
        except Exception as exc:  # the Rust extension raises many kinds; all are the expression's
            raise EvaluationError(
                f"CEL expression {_quoted(self.source)} failed: {_failure_detail(exc)}"
            ) from exc
        try:
            return _plain(value)
        except _NotJson as exc:
            raise EvaluationError(
                f"CEL expression {_quoted(self.source)} gives {exc}, which JSON cannot hold"
            ) from exc

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        """Pickled and copied by source: the compiled program itself cannot be."""
        return (expression_compile, (self.source,))


@lru_cache(maxsize=_COMPILED_MAX)
def expression_compile(source: str) -> Expression:
    """Compile `source` once (cached: every run of a workflow shares its expressions)."""
    if not source.strip():
        raise ExpressionError("CEL syntax error: empty expression")
    try:
        program = cel.compile(source)
    except ValueError as exc:
        raise ExpressionError(_syntax_message(source, exc)) from exc
    lookups = tuple(program.variables())
    names = (free_names(source) & frozenset(lookups)) - CEL_BUILTIN_NAMES
    cost = _bounded_cost(source)
    return Expression(source=source, names=names, _program=program, _lookups=lookups, _cost=cost)


def _bounded_cost(source: str) -> CostBound:
    """The expression's cost bound; raises ExpressionError when no input can make it cheap
    enough: comprehensions nested past EXPRESSION_MAX_NESTING (cost grows as the input's
    length to that power), or over the limit with empty inputs."""
    cost = cost_bound(source)
    if cost.depth > (deepest := limits().expression_nesting):
        raise ExpressionError(
            f"expression_limit: CEL expression {_quoted(source)} nests comprehensions "
            f"{cost.depth} deep, more than EXPRESSION_MAX_NESTING ({deepest}): its cost "
            "cannot be bounded"
        )
    if cost.loops and (units := cost.units(extent(()))) > (limit := limits().expression_cost):
        raise ExpressionError(
            f"expression_limit: CEL expression {_quoted(source)} costs {units:,} units even "
            f"over empty inputs, more than EXPRESSION_COST_LIMIT ({limit:,})"
        )
    return cost


@dataclass(frozen=True)
class Template:
    """Text with `{{ <CEL> }}` placeholders: literal parts and expressions, in order."""

    source: str
    parts: tuple[str | Expression, ...]
    names: frozenset[str]
    _lookups: frozenset[str] = field(compare=False, repr=False, default=frozenset())

    def render(self, scope: Mapping[str, Any]) -> str:
        """The text with each placeholder's value: strings as they are, the rest as compact JSON.

        The placeholders share one converted scope: converting a value for cel costs far more
        than running an expression (a dict of 20 small lines: ~80 µs against ~1 µs).
        """
        values = {name: scope[name] for name in self._lookups if name in scope}
        for part in self.parts:
            if isinstance(part, Expression):
                part.check_cost(values[name] for name in part._lookups if name in values)
        try:
            context = cel.Context(values)
        except Exception:  # a value cel cannot take: the placeholder reading it says which
            return "".join(
                p if isinstance(p, str) else _json_text(p.evaluate(scope)) for p in self.parts
            )
        return "".join(p if isinstance(p, str) else _json_text(p._run(context)) for p in self.parts)

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (template_compile, (self.source,))


def _json_text(value: Any) -> str:
    """A placeholder's value as text: a string as it is, anything else as compact JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _position(text: str, index: int) -> str:
    """`column N` (1-based), with the line when the text has several."""
    line = text.count("\n", 0, index) + 1
    column = index - (text.rfind("\n", 0, index) + 1) + 1
    return f"column {column}" if "\n" not in text else f"line {line}, column {column}"


def _placeholder(source: str, opening: int) -> tuple[Expression, int]:
    """The expression of the placeholder opening at `opening`, and the index past its `}}`."""
    start = opening + 2
    end = placeholder_end(source, start)
    if end is None:
        raise ExpressionError(f"unclosed '{{{{' at {_position(source, opening)}")
    cel_source = source[start:end].strip()
    if not cel_source:
        raise ExpressionError(f"empty placeholder '{{{{ }}}}' at {_position(source, opening)}")
    return expression_compile(cel_source), end + 2


def template_compile(source: str) -> Template:
    """Split `source` into text and compiled placeholders; raises ExpressionError."""
    parts: list[str | Expression] = []
    pos = 0
    while (opening := source.find("{{", pos)) != -1:
        if opening > pos:
            parts.append(source[pos:opening])
        expression, pos = _placeholder(source, opening)
        parts.append(expression)
    if pos < len(source):
        parts.append(source[pos:])
    expressions = [p for p in parts if isinstance(p, Expression)]
    return Template(
        source=source,
        parts=tuple(parts),
        names=frozenset().union(*(e.names for e in expressions)),
        _lookups=frozenset().union(*(e._lookups for e in expressions)),
    )
