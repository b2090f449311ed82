"""A step's batch bound to SQL literals in Python for its common values.

`record/rows.py` fills a batch's placeholders itself (one round trip, prepared statements),
with each value's SQL literal. psycopg's own literal (a dumper look-up and libpq's escaping
through its Python layer) costs ~3 µs a value, hundreds a step; text, integers, decimals,
booleans, UUIDs and jsonb given as text are quoted here instead. It reproduces libpq's
`PQescapeLiteral` for UTF-8 and the dumpers psycopg registers by default, and is proven on
each connection's own adapters (`_PROBES`) before that connection uses it.

It relies on psycopg's `Transformer.as_literal` (kept per connection: it caches its
dumpers) and on the bytes its dumpers write; the versions it was written for are in
runtime/fastpaths/__init__.py. Off, each value is psycopg's public `sql.Literal`.
"""

from collections.abc import Callable
from decimal import Decimal
from typing import Any
from uuid import UUID

from psycopg import sql
from psycopg.adapt import Transformer
from psycopg.types.json import Jsonb
from psycopg.types.numeric import Int2, Int4, Int8

from runtime import fastpaths


def _as_is(text: str) -> str:
    return text


class JsonbText(Jsonb):
    """A jsonb parameter given as its JSON text, made once by the caller and sent as is.

    For a value whose text is needed elsewhere too (an event's payload is
    also the published frame's): psycopg's own jsonb dumper, with a `dumps`
    that returns the text it is handed, so the statement is byte for byte
    what the value itself would have given, without a second json.dumps.
    """

    __slots__ = ()

    def __init__(self, text: str):
        super().__init__(text, dumps=_as_is)


def _quoted(text: str) -> bytes:
    """libpq's PQescapeLiteral of UTF-8 text without NUL: quotes doubled; with a
    backslash, an E'' literal (preceded by a space) with backslashes doubled too.
    A multibyte UTF-8 sequence never holds either byte, so bytes are replaced as is."""
    data = text.encode()
    if b"\\" in data:
        return b" E'" + data.replace(b"\\", b"\\\\").replace(b"'", b"''") + b"'"
    return b"'" + data.replace(b"'", b"''") + b"'"


_SIZED_INTS = frozenset((int, Int2, Int4, Int8))


def _literal_of(slow: Callable[[Any], bytes]) -> Callable[[Any], bytes]:
    """psycopg's `as_literal`, with the step's common values quoted in Python.

    Text (Django's str dumper: no type cast), integers (the field's sized int
    types or plain: unquoted, a negative one after a space), finite decimals
    (the same), booleans, UUIDs and `JsonbText` are what a step's batch is
    made of: psycopg spends ~3 µs
    a value on them (a dumper look-up and libpq's escaping through its
    Python layer). Anything else, and text holding NUL (which psycopg refuses
    with its own error), goes to psycopg.
    """

    def literal(value: Any) -> bytes:
        kind = type(value)
        if kind is str:
            return slow(value) if "\x00" in value else _quoted(value)
        if kind is bool:
            return b"true" if value else b"false"
        if kind in _SIZED_INTS:
            return b"%d" % value if value >= 0 else b" %d" % value
        if kind is UUID:
            return b"'%s'::uuid" % value.hex.encode()
        if kind is Decimal and value.is_finite():
            text = str(value).encode()
            return b" " + text if text[0] == 45 else text  # 45: "-"
        if kind is JsonbText:
            text = value.obj
            return slow(value) if "\x00" in text else _quoted(text) + b"::jsonb"
        return slow(value)

    return literal


# Values whose literal the fast path must give exactly as psycopg does on a
# connection before it is used there (see _literals).
_PROBES: tuple[Any, ...] = (
    "plain",
    "",
    "it's",
    "back\\slash and 'quote' \\'",
    "ünïcødé ✓ \u2028 😀",
    0,
    7,
    -7,
    2**70,
    -(2**70),
    Int2(-3),
    Int4(2**31 - 1),
    Int8(-(2**40)),
    Decimal("0.0012"),
    Decimal("-1.5"),
    Decimal("-0"),
    Decimal("1E+3"),
    Decimal("0E-10"),
    True,
    False,
    UUID("12345678-1234-5678-1234-567812345678"),
    JsonbText('{"a": "b\\n", "q": "it\'s"}'),
    JsonbText('["\\u00e9", 1.5e+20, null]'),
)


class Literals:
    """One driver connection's way of turning values into SQL literals."""

    def __init__(self, raw: Any):
        self.fast: Callable[[Any], bytes] | None = None
        if not fastpaths.enabled("sql_literals"):
            self.slow: Callable[[Any], bytes] = lambda value: sql.Literal(value).as_bytes(raw)
            return
        self.slow = Transformer.from_context(raw).as_literal
        fast = _literal_of(self.slow)
        if raw.info.encoding == "utf-8" and all(fast(p) == self.slow(p) for p in _PROBES):
            self.fast = fast

    def for_batch(self, raw: Any) -> Callable[[Any], bytes]:
        # Literals do not depend on the setting (PQescapeLiteral writes E'' for a
        # backslash either way); checked anyway, so nothing unusual takes the fast path.
        on = raw.info.parameter_status("standard_conforming_strings") == "on"
        return self.fast if self.fast is not None and on else self.slow
