"""sessions/rows.py: the step's batch binds exactly what psycopg would, and the
fast value conversion matches the fields' own get_db_prep_save."""

import json
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any
from uuid import uuid4

import pytest
from django.db import connection

from sessions.engine.commit import MESSAGE_COLUMNS
from sessions.models import Event, Message, ModelCall, ToolCall
from sessions.rows import (
    JsonbText,
    _bound,
    _savers,
    execute_batch,
    insert_statement,
    json_value,
    jsonb_value,
)

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
