"""Bounds on every JSON value the platform accepts from a caller: REST bodies,
websocket frames, session metadata (and later extra context, tool arguments).

What gets past these checks can be stored and echoed back without a 500:
- nesting is bounded, because Python's json, DRF and psycopg all recurse and a
  deep enough value raises RecursionError (a 100k-deep body, or metadata ~330 deep);
- numbers are finite and short, because `1e400` decodes to infinity, which jsonb
  refuses ("invalid input syntax for type json"), and a 3,000-digit literal is
  no number anyone means;
- strings hold no lone surrogate (`"\\ud800"`), which is not Unicode text:
  neither PostgreSQL nor a UTF-8 response can carry it;
- strings hold no NUL (PostgreSQL stores none in text or jsonb), unless the
  caller checks NUL per field itself to name the field in its error;
- the compact UTF-8 encoding fits a byte budget, where the caller gives one.

The walk is iterative, so checking a value never recurses however deep it is.
"""

import json
import math
from dataclasses import dataclass
from typing import Any

from django.conf import settings

# A JSON number literal longer than this is refused: 64-bit integers have 20
# digits and doubles 17 significant ones, so 100 leaves room for any sane notation.
NUMBER_MAX_CHARS = 100
_INT_BOUND = 10**NUMBER_MAX_CHARS
_KEY_IN_PATH_CHARS = 40


class JsonRejected(ValueError):
    """A JSON value broke a bound: where (`path`, e.g. `$.metadata.tags[3]`) and why."""

    def __init__(
        self, path: str, reason: str, *, too_large: bool = False, limit: int | None = None
    ) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason
        self.too_large = too_large
        self.limit = limit

    @property
    def message(self) -> str:
        return f"{self.path}: {self.reason}"

    @property
    def details(self) -> dict[str, Any]:
        details: dict[str, Any] = {"path": self.path, "reason": self.reason}
        if self.limit is not None:
            details["limit"] = self.limit
        return details


@dataclass(frozen=True)
class _BadNumber:
    """Stands in for a number literal the decoder refused, so the walk can say where it was."""

    literal: str
    reason: str


def _parse_float(literal: str) -> float | _BadNumber:
    if len(literal) > NUMBER_MAX_CHARS:
        return _BadNumber(literal, f"number has more than {NUMBER_MAX_CHARS} characters")
    value = float(literal)
    if not math.isfinite(value):
        return _BadNumber(literal, "number is out of range (not a finite double)")
    return value


def _parse_int(literal: str) -> int | _BadNumber:
    if len(literal) > NUMBER_MAX_CHARS:
        return _BadNumber(literal, f"number has more than {NUMBER_MAX_CHARS} characters")
    return int(literal)


def _parse_constant(name: str) -> Any:
    # NaN, Infinity and -Infinity are not JSON; the decoder turns this into a syntax error.
    raise ValueError(f"{name} is not valid JSON")


def _key_path(parent: str, key: str) -> str:
    if key.isidentifier() and key.isascii():
        return f"{parent}.{key}"
    # json.dumps escapes NUL and surrogates, so the path is always printable ASCII.
    shown = key if len(key) <= _KEY_IN_PATH_CHARS else key[:_KEY_IN_PATH_CHARS] + "..."
    return f"{parent}[{json.dumps(shown)}]"


def _string_problem(text: str, allow_nul: bool) -> str | None:
    if not allow_nul and "\x00" in text:
        return "contains a NUL (\\u0000) character"
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return "contains a lone surrogate (an unpaired \\ud800-\\udfff escape)"
    return None


def _max_depth(max_depth: int | None) -> int:
    return int(settings.JSON_MAX_DEPTH) if max_depth is None else max_depth


def json_check(
    value: Any,
    *,
    root: str = "$",
    max_depth: int | None = None,
    max_bytes: int | None = None,
    allow_nul: bool = False,
) -> None:
    """Raise JsonRejected unless `value` is within bounds.

    Depth counts containers: `1` is 0 deep, `{"a": 1}` 1, `{"a": [1]}` 2.
    `max_depth` defaults to settings.JSON_MAX_DEPTH; `max_bytes` (the size of
    the compact UTF-8 encoding) to no limit.
    """
    limit = _max_depth(max_depth)
    # (value, path, depth of the containers around it)
    pending: list[tuple[Any, str, int]] = [(value, root, 0)]
    while pending:
        item, path, depth = pending.pop()
        if isinstance(item, dict):
            if depth + 1 > limit:
                raise JsonRejected(path, f"nested deeper than {limit} levels", limit=limit)
            for key, child in item.items():
                if not isinstance(key, str):
                    raise JsonRejected(path, f"object key {key!r} is not a string")
                child_path = _key_path(path, key)
                problem = _string_problem(key, allow_nul)
                if problem is not None:
                    raise JsonRejected(child_path, f"key {problem}")
                pending.append((child, child_path, depth + 1))
        elif isinstance(item, list):
            if depth + 1 > limit:
                raise JsonRejected(path, f"nested deeper than {limit} levels", limit=limit)
            pending.extend((child, f"{path}[{i}]", depth + 1) for i, child in enumerate(item))
        elif isinstance(item, str):
            problem = _string_problem(item, allow_nul)
            if problem is not None:
                raise JsonRejected(path, problem)
        elif isinstance(item, _BadNumber):
            raise JsonRejected(path, item.reason)
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise JsonRejected(path, "number is out of range (not a finite double)")
        elif isinstance(item, bool) or item is None:
            pass
        elif isinstance(item, int):
            if abs(item) >= _INT_BOUND:
                raise JsonRejected(path, f"number has more than {NUMBER_MAX_CHARS} characters")
        else:
            raise JsonRejected(path, f"{type(item).__name__} is not a JSON value")
    if max_bytes is None:
        return
    # Safe to encode now: bounded depth, no surrogate, finite numbers.
    size = len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))
    if size > max_bytes:
        raise JsonRejected(
            root,
            f"is {size} bytes as compact JSON; the limit is {max_bytes}",
            too_large=True,
            limit=max_bytes,
        )


def json_loads(text: str | bytes, *, max_depth: int | None = None) -> Any:
    """Decode a caller's JSON text and check it (NUL allowed: fields check it and name themselves).

    Raises ValueError for text that is not JSON (including NaN and Infinity)
    and JsonRejected (a ValueError too) for JSON that breaks a bound.
    """
    limit = _max_depth(max_depth)
    try:
        value = json.loads(
            text,
            parse_float=_parse_float,
            parse_int=_parse_int,
            parse_constant=_parse_constant,
        )
    except RecursionError:
        # The decoder recurses once per level; far past any limit we accept.
        raise JsonRejected("$", f"nested deeper than {limit} levels", limit=limit) from None
    json_check(value, max_depth=limit, allow_nul=True)
    return value
