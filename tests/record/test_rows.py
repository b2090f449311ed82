"""record/rows.py: the step's batch binds exactly what psycopg would, and the
fast value conversion matches the fields' own get_db_prep_save."""

import json
from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any
from uuid import UUID, uuid4

import pytest
from django.db import DataError, ProgrammingError, connection
from psycopg.types.json import Jsonb
from psycopg.types.numeric import Int2, Int4, Int8

from engine.store.commit import MESSAGE_COLUMNS
from record import rows
from record.models import Event, Message, ModelCall, ToolCall
from record.rows import (
    JsonbText,
    _bound,
    _savers,
    execute_batch,
    insert_statement,
    json_value,
    jsonb_value,
)
from runtime.fastpaths import sql_literals

from ..factories import SessionFactory

pytestmark = pytest.mark.django_db

AWKWARD: list[Any] = [
    "it's 100% done; \\n\n -- not a comment",
    "",
    "ünïcødé ✓",
    None,
    0,
    -7,
    2**40,
    True,
    False,
    Decimal("0.000123"),
    datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC),
    uuid4(),
]


def test_bound_batch_is_what_psycopg_binds() -> None:
    statements = [("SELECT %s, %s", AWKWARD[:2]), ("SELECT " + ", ".join(["%s"] * 10), AWKWARD[2:])]
    with connection.cursor() as cursor:
        ours = _bound(connection.connection, statements)
        theirs = cursor.cursor.mogrify(
            ";\n".join(sql for sql, _ in statements), [p for _, ps in statements for p in ps]
        )
    assert ours == theirs


def test_bound_values_round_trip() -> None:
    sql = "SELECT " + ", ".join(["%s"] * len(AWKWARD))
    [[row]] = execute_batch([(sql, AWKWARD)])
    assert list(row) == AWKWARD


@pytest.mark.parametrize(
    ("model", "obj"),
    [
        (
            Message,
            Message(
                session_id=uuid4(), seq=3, turn=1, role="tool", status="final",
                content="x%s'y", tool_calls=[{"id": "a", "arguments": {"q": None}}],
                tool_call_id="c1", name="t", data={"k": [1, "2"]}, token_count=5,
                idempotency_key=None, created_at=datetime.now(UTC),
            ),
        ),
        (
            ToolCall,
            ToolCall(
                session_id=uuid4(), turn=1, step=2, position=0, call_id="c", tool_name="t",
                input={"a": 1}, status="executing", output=None, error="", elapsed_ms=None,
                coercions=[], cached=False, attempts=0, dispatched_at=None,
                probe_outcome="", idempotency_key="k", finished_at=None,
            ),
        ),
        (ModelCall, ModelCall(session_id=uuid4(), turn=1, step=1, cost=Decimal("0.5"))),
        (Event, Event(session_id=uuid4(), seq=1, type="state.changed", data={"a": "b"})),
    ],
)  # fmt: skip
def test_savers_match_get_db_prep_save(model: Any, obj: Any) -> None:
    names = tuple(f.name for f in model._meta.concrete_fields if not f.primary_key)
    for attname, save in _savers(model, names, ()):
        field = next(f for f in model._meta.concrete_fields if f.attname == attname)
        value = getattr(obj, attname)
        ours, theirs = save(value, connection), field.get_db_prep_save(value, connection)
        assert type(ours) is type(theirs), attname
        assert getattr(ours, "obj", ours) == getattr(theirs, "obj", theirs), attname


def test_insert_statement_writes_awkward_text() -> None:
    session = SessionFactory()
    text = "quote ' percent %s %% semicolon;\nINSERT newline"
    message = Message(
        session_id=session.pk, seq=1, turn=1, role="user", status="final", content=text,
        data={"t": text}, token_count=1,
    )  # fmt: skip
    statement = insert_statement(
        Message, [message], MESSAGE_COLUMNS, returning=True, now=("created_at",)
    )
    [[(pk,)]] = execute_batch([statement])
    stored = Message.objects.get(pk=pk)
    assert (stored.content, stored.data) == (text, {"t": text})


@pytest.mark.parametrize(
    "value",
    [
        {"big": 1.5e20, "odd": 1.2345678901234567e25, "zero": -0.0, "small": 1e-05, "x": 0.1},
        {"tuple": (1, [2.0, None]), "keys": {3: "three"}, "text": 'ünï\n"q"'},
        [5e-324, -1.5e300, 12345678.123456789, True, None],
        "just text",
    ],
)
def test_jsonb_value_is_what_the_column_gives_back(value: Any) -> None:
    [[stored]] = execute_batch([("SELECT %s::jsonb", [json.dumps(value)])])[0] or [[None]]
    back = json_value(stored)
    # The guards compare and hash the JSON text: the same text, not just equal numbers.
    assert json.dumps(jsonb_value(value), sort_keys=True) == json.dumps(back, sort_keys=True)


HOSTILE_JSON: list[Any] = [
    {"q": 'it\'s \\ 100% "done"; -- \n\t ünïcødé ✓ \u2028', "n": [1, 2.5, -0.0, 1.5e20, None]},
    {"nested": {"deep": [{"x": True}, {"y": False}]}, "empty": {}, "list": []},
    ["%s", "%%", "$1", "'); DROP TABLE x; --"],
    "just text",
    0,
]


@pytest.mark.parametrize("value", HOSTILE_JSON)
def test_jsonb_text_binds_as_the_value_would(value: Any) -> None:
    """The text made once is bound byte for byte as Django's own jsonb parameter of the value."""
    field = Event._meta.get_field("data")
    [(_, save)] = [s for s in _savers(Event, ("data",), ()) if s[0] == "data"]
    ours = save(JsonbText(json.dumps(value)), connection)
    assert type(ours) is JsonbText  # passed through, not wrapped again
    with connection.cursor():
        assert _bound(connection.connection, [("SELECT %s", [ours])]) == _bound(
            connection.connection, [("SELECT %s", [field.get_db_prep_save(value, connection)])]
        )
    [[(stored,)]] = execute_batch([("SELECT %s", [ours])])
    assert json_value(stored) == json_value(
        execute_batch([("SELECT %s", [field.get_db_prep_save(value, connection)])])[0][0][0]  # type: ignore[index]
    )


HOSTILE: list[Any] = [
    "plain",
    "",
    "'",
    "''",
    "\\",
    "\\'",
    "it's 100% done; \\n\n -- not a comment */ /*",
    "E'\\x41' $$dollar$$ $tag$ ;\n DROP TABLE x; --",
    "ünïcødé ✓ \u2028\u2029 😀 \ufeff 中文 \u00a0",
    "tab\tcr\rlf\nbell\x07 del\x7f",
    "%s %% %(name)s {0}",
    "x" * 5000 + "'" + "\\" * 3,
    0,
    1,
    -1,
    2**31,
    -(2**31) - 1,
    2**63,
    -(2**63) - 1,
    10**40,
    -(10**40),
    Int2(-32768),
    Int4(2**31 - 1),
    Int8(-(2**63)),
    True,
    False,
    None,
    Decimal("0"),
    Decimal("-0.000001"),
    Decimal("1e+30"),
    Decimal("NaN"),
    Decimal("Infinity"),
    Decimal("-Infinity"),
    Decimal("-0"),
    Decimal("-1E+3"),
    Decimal("0E-12"),
    Decimal("123456789012345678901234567890.123456789"),
    1.5,
    -0.0,
    datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC),
    uuid4(),
    UUID("00000000-0000-0000-0000-000000000000"),
    Jsonb({"a": 'it\'s \\ "q" ünï', "n": [1, None, 1.5e20]}),
    JsonbText(json.dumps({"a": 'it\'s \\ "q" ünï\n', "n": [1, None, 1.5e20]})),
    JsonbText(json.dumps("ünï ✓", ensure_ascii=False)),
    JsonbText("{}"),
]


def test_the_fast_literals_are_what_psycopg_binds(settings: Any) -> None:
    """The Python quoting of the common types gives psycopg's bytes for hostile values."""
    settings.FAST_PATHS = True
    with connection.cursor() as cursor:
        raw = connection.connection
        assert sql_literals.Literals(raw).fast is not None  # this connection takes the fast path
        for value in HOSTILE:
            statement = ("SELECT %s", [value])
            assert _bound(raw, [statement]) == cursor.cursor.mogrify(*statement), value
        many = [("SELECT " + ", ".join(["%s"] * len(HOSTILE)), HOSTILE)]
        assert _bound(raw, many) == cursor.cursor.mogrify(*many[0])
    # And the server reads them back as they were.
    readable = [v for v in HOSTILE if not isinstance(v, Jsonb) and v == v]  # NaN != NaN
    [[row]] = execute_batch([("SELECT " + ", ".join(["%s"] * len(readable)), readable)])
    assert list(row) == readable


@pytest.mark.parametrize("value", ["nul \x00 inside", JsonbText('"nul \x00"'), "\ud800"])
def test_what_psycopg_refuses_or_cuts_short_is_left_to_it(value: Any) -> None:
    """NUL (text refuses it; libpq's escaping of jsonb text stops at it) and a lone
    surrogate (not encodable): the same error or the same bytes as psycopg."""

    def outcome(bind: Callable[[], Any]) -> Any:
        try:
            return bind()
        except Exception as exc:  # noqa: BLE001 - the error itself is compared
            return type(exc), str(exc)

    with connection.cursor() as cursor:
        theirs = outcome(lambda: cursor.cursor.mogrify("SELECT %s", [value]))
        ours = outcome(lambda: _bound(connection.connection, [("SELECT %s", [value])]))
    assert ours == theirs


def test_a_connection_that_quotes_otherwise_takes_psycopgs_path(
    monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    settings.FAST_PATHS = True
    with connection.cursor() as cursor:
        raw = connection.connection
        literals = sql_literals.Literals(raw)
        assert literals.for_batch(raw) is literals.fast
        cursor.execute("SET standard_conforming_strings = off")
        try:
            assert literals.for_batch(raw) is literals.slow
        finally:
            cursor.execute("SET standard_conforming_strings = on")
        # A probe the fast path would get wrong: the connection never uses it.
        monkeypatch.setattr(sql_literals, "_quoted", lambda text: b"'" + text.encode() + b"'")
        assert sql_literals.Literals(raw).fast is None


def test_off_every_value_is_psycopgs_own_literal(settings: Any) -> None:
    """FAST_PATHS=off: psycopg's public sql.Literal binds each value, the same bytes."""
    settings.FAST_PATHS = False
    with connection.cursor() as cursor:
        raw = connection.connection
        literals = sql_literals.Literals(raw)
        assert literals.fast is None and literals.for_batch(raw) is literals.slow
        for value in HOSTILE:
            if value is not None:
                assert literals.slow(value) == cursor.cursor.mogrify("%s", [value]).encode()


# --- Prepared batches -------------------------------------------------------------------


class _Sent:
    """The texts this connection sends, through Django's execute wrapper."""

    def __init__(self) -> None:
        self.texts: list[str] = []

    def __call__(self, run: Callable[..., Any], sql: str, *args: Any) -> Any:
        self.texts.append(sql)
        return run(sql, *args)

    def kinds(self) -> list[list[str]]:
        return [[part.split(None, 1)[0] for part in text.split(";\n")] for text in self.texts]


def _fresh(sql: str) -> str:
    """The text made new to every connection (a statement's name is its text's digest)."""
    return f"{sql} /* {uuid4().hex} */"


def _prepared_names() -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT name FROM pg_prepared_statements")
        return {name for (name,) in cursor.fetchall()}


def test_a_batch_is_prepared_once_per_connection_and_gives_the_same_rows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(rows, "PREPARED_PER_CONNECTION", 10_000)  # earlier tests' texts fit
    typed = ", ".join(f"%s::{t}" for t in ("text", "text", "text", "integer", "integer", "bigint"))
    typed += ", %s::boolean, %s::boolean, %s::numeric, %s::timestamptz, %s::uuid"
    statements = [
        (_fresh(f"SELECT {typed}"), [v for v in AWKWARD if v is not None]),
        (_fresh("SELECT %s::text || '%%' AS percent, %s::integer IS NULL"), ["a", None]),
    ]
    sent = _Sent()
    with connection.execute_wrapper(sent):
        first = execute_batch(statements, prepare=True)
        again = execute_batch(statements, prepare=True)
    assert first == again == execute_batch(statements)
    assert first[1] == [("a%", True)]
    # The first batch prepared both texts; the second only ran them.
    assert sent.kinds() == [["PREPARE", "PREPARE", "EXECUTE", "EXECUTE"], ["EXECUTE", "EXECUTE"]]
    literals = rows._literals_of(connection.connection)
    names = {rows._prepared_form(sql)[0] for sql, _ in statements}
    assert {f"ap{literals.generation}_{n}" for n in names} <= _prepared_names()


def test_switched_off_a_batch_is_sent_as_text(settings: Any) -> None:
    settings.DB_PREPARED_STATEMENTS = False
    sent = _Sent()
    with connection.execute_wrapper(sent):
        [[(value,)]] = execute_batch([(_fresh("SELECT %s::integer"), [7])], prepare=True)
    assert value == 7 and sent.kinds() == [["SELECT"]]


def test_a_full_connection_starts_over(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past PREPARED_PER_CONNECTION a batch deallocates everything and prepares
    what it needs; more distinct texts than that in one batch go as text."""
    monkeypatch.setattr(rows, "PREPARED_PER_CONNECTION", 2)
    a, b, c, d = (_fresh(f"SELECT %s::integer + {n}") for n in range(4))
    sent = _Sent()
    with connection.execute_wrapper(sent):
        assert execute_batch([(a, [1]), (b, [1]), (c, [1])], prepare=True) == [
            [(1,)],
            [(2,)],
            [(3,)],
        ]
        assert execute_batch([(a, [5]), (b, [5])], prepare=True) == [[(5,)], [(6,)]]
        assert execute_batch([(d, [5])], prepare=True) == [[(8,)]]
    assert sent.kinds() == [
        ["DEALLOCATE", "PREPARE", "PREPARE", "EXECUTE", "EXECUTE", "SELECT"],
        ["EXECUTE", "EXECUTE"],
        ["DEALLOCATE", "PREPARE", "EXECUTE"],
    ]
    assert len(_prepared_names()) == 1


@pytest.mark.django_db(transaction=True)
def test_a_failed_batch_prepares_again_under_new_names() -> None:
    """A batch that fails may or may not have run its PREPAREs: the next one uses
    new names rather than guess."""
    divide = (_fresh("SELECT %s::integer / %s::integer"), [1, 0])
    connection.ensure_connection()
    literals = rows._literals_of(connection.connection)
    generation = literals.generation
    with pytest.raises(DataError):
        execute_batch([divide], prepare=True)
    assert literals.generation == generation + 1
    sent = _Sent()
    with connection.execute_wrapper(sent):
        assert execute_batch([(divide[0], [6, 3])], prepare=True) == [[(2,)]]
    assert sent.kinds() == [["PREPARE", "EXECUTE"]]


@pytest.mark.django_db(transaction=True)
def test_a_reset_session_fails_one_batch_and_the_next_prepares_afresh() -> None:
    """A pooler resetting the connection (DISCARD ALL, whose part that matters here
    is DEALLOCATE ALL: the rest would also reset this connection's time zone for
    the tests after) drops what was prepared: the batch that finds it gone fails;
    the next one prepares again."""
    statement = (_fresh("SELECT %s::integer * 2"), [21])
    assert execute_batch([statement], prepare=True) == [[(42,)]]
    with connection.cursor() as cursor:
        cursor.execute("DEALLOCATE ALL")
    with pytest.raises(ProgrammingError, match="does not exist"):
        execute_batch([statement], prepare=True)
    assert execute_batch([statement], prepare=True) == [[(42,)]]
