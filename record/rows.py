"""Fast multi-row writes for the step transaction.

The ORM's bulk_create/bulk_update spend most of a step's CPU building queries
(DESIGN.md: ~3 ms a step through the ORM against ~0.8 ms in raw SQL). These
helpers build each statement's text once per model and field list, convert
values with the fields' own `get_db_prep_save`, and `execute_batch` sends all
of a step's writes in one round trip (psycopg binds client-side by default in
Django, so several statements can share one execute).

A step's batch is also prepared on the server (`execute_batch(prepare=True)`,
`DB_PREPARED_STATEMENTS`): parsing, analysing and planning its ~9 statements
was ~60 % of the server's time for the batch (2.3 -> 0.9 ms a model step's,
measured), which LangGraph's checkpointer does not pay (psycopg prepares its
few statements). Each statement text is prepared once per connection, at the
front of the first batch that needs it, and run by `EXECUTE name(literals)`:
the same single round trip and implicit transaction as before.
"""

import hashlib
import itertools
import json
import re
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from functools import cache, lru_cache
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connection, connections, models
from psycopg import pq

from runtime.fastpaths import sql_literals
from runtime.fastpaths.sql_literals import JsonbText as JsonbText  # the step's jsonb values

Statement = tuple[str, list[Any]]


def json_value(value: Any) -> Any:
    """A jsonb column read with a raw cursor: Django's driver setup hands it over as text."""
    return json.loads(value) if isinstance(value, str) else value


class RowReader:
    """A model's concrete columns read by a plain cursor: the select list, and the
    instance built with `from_db` (a RawQuerySet re-resolves its columns against
    the model at every call). jsonb columns come as text (`json_value`)."""

    def __init__(self, model: type[models.Model]):
        fields = model._meta.concrete_fields
        self.model = model
        self.columns = [f.column for f in fields]
        self.names = [f.attname for f in fields]
        self.is_json = [isinstance(f, models.JSONField) for f in fields]

    def select(self, alias: str = "") -> str:
        prefix = f"{alias}." if alias else ""
        return ", ".join(f'{prefix}"{column}"' for column in self.columns)

    def instance(self, row: Sequence[Any]) -> Any:
        """The model instance from the row's first len(columns) values."""
        values = [json_value(v) if j else v for j, v in zip(self.is_json, row, strict=False)]
        return self.model.from_db(connection.alias, self.names, values)


@cache
def row_reader(model: type[models.Model]) -> RowReader:
    """Built once per model, lazily: the metadata is complete only once the app
    registry is."""
    return RowReader(model)


def _jsonb_float(text: str) -> float | int:
    value = float(text)
    if value == 0:
        return 0.0  # numeric has no negative zero
    if "e+" in text or "E+" in text:
        # numeric prints a large number without an exponent: it reads back as an integer.
        return int(Decimal(text))
    return value


def jsonb_value(value: Any) -> Any:
    """The value as a jsonb column gives it back (`json_value` of what it stored).

    Written with json.dumps (a JSONField without an encoder), read back by
    json.loads: tuples become lists, keys strings; numeric keeps a float's
    digits, but not its sign at zero nor its exponent.
    """
    return json.loads(json.dumps(value), parse_float=_jsonb_float)


@lru_cache(maxsize=64)
def _columns(model: type[models.Model], names: tuple[str, ...]) -> tuple[list[Any], str]:
    fields: list[Any] = [model._meta.get_field(name) for name in names]
    return fields, ", ".join(f'"{f.column}"' for f in fields)


def _cast(field: Any) -> str:
    # No length: an explicit cast to varchar(n) would truncate silently where
    # the INSERT's own assignment raises, as it always did.
    return re.sub(r"^(varchar|character varying)\(\d+\)$", "varchar", field.db_type(connection))


Saver = Callable[[Any, Any], Any]

# Values of these exact types pass through the field's get_db_prep_save
# unchanged on PostgreSQL (integers are only wrapped in psycopg's sized int
# types): the step's hundreds of values skip Django's per-value conversion
# chain, every other value still takes it.
_PLAIN = {"CharField": str, "TextField": str, "BooleanField": bool, "UUIDField": UUID}


def _saver(field: Any) -> Saver:
    """`field.get_db_prep_save(value, connection)`, short-cut for the common plain values."""
    if field.is_relation:
        target = field.target_field
        inner = _saver(target)
        return lambda value, conn: None if value is None else inner(value, conn)
    internal = field.get_internal_type()
    slow = field.get_db_prep_save
    # PostgreSQL (psycopg 3) only: the sized int wrappers its adapt_integerfield_value uses.
    sized = getattr(connection.ops, "integerfield_type_map", {}).get(internal)
    if sized is not None:
        return lambda value, conn: (
            sized(value) if type(value) is int else None if value is None else slow(value, conn)
        )
    plain = _PLAIN.get(internal)
    if plain is not None:
        return lambda value, conn: (
            value if value is None or type(value) is plain else slow(value, conn)
        )
    if internal == "JSONField":
        # Already the driver's jsonb parameter: Django's own conversion would wrap it again.
        return lambda value, conn: value if type(value) is JsonbText else slow(value, conn)
    if internal == "DateTimeField":
        return lambda value, conn: (
            value
            if value is None or (type(value) is datetime and value.tzinfo is not None)
            else slow(value, conn)
        )
    return slow


@lru_cache(maxsize=64)
def _savers(
    model: type[models.Model], names: tuple[str, ...], now: tuple[str, ...]
) -> list[tuple[str, Saver]]:
    fields, _ = _columns(model, names)
    return [(f.attname, _saver(f)) for f in fields if f.name not in now]


@lru_cache(maxsize=128)
def _row(
    model: type[models.Model], names: tuple[str, ...], now: tuple[str, ...]
) -> tuple[list[Any], str]:
    """The fields that take parameters, and one VALUES row (typed: it may sit in a SELECT)."""
    fields, _ = _columns(model, names)
    parts = ["now()" if f.name in now else f"%s::{_cast(f)}" for f in fields]
    return [f for f in fields if f.name not in now], "(" + ", ".join(parts) + ")"


def insert_statement(
    model: type[models.Model],
    objs: Sequence[models.Model],
    names: tuple[str, ...],
    *,
    returning: bool = False,
    guard: str = "",
    now: tuple[str, ...] = (),
) -> Statement | None:
    """One multi-row INSERT for the objects; with `returning`, it yields their primary keys.

    `guard`: an SQL condition; nothing is inserted unless it holds (a batch
    whose first statement may not match). `now`: fields set to the
    transaction's `now()` instead of the objects' values.
    """
    attnames = [attname for attname, _ in _savers(model, names, now)]
    rows = [[getattr(obj, attname) for attname in attnames] for obj in objs]
    return insert_rows(model, rows, names, returning=returning, guard=guard, now=now)


def insert_rows(
    model: type[models.Model],
    rows: Sequence[Sequence[Any]],
    names: tuple[str, ...],
    *,
    returning: bool = False,
    guard: str = "",
    now: tuple[str, ...] = (),
) -> Statement | None:
    """`insert_statement` for rows given as values, one per name not in `now`, in order.

    Rows that are only written (events, transitions, checkpoints) need no
    model instance: building one costs more than the row's conversion.
    """
    if not rows:
        return None
    _, columns = _columns(model, names)
    _, row = _row(model, names, now)
    savers = [save for _, save in _savers(model, names, now)]
    conn = connections[DEFAULT_DB_ALIAS]  # the proxy would look it up again per value
    params: list[Any] = []
    for values in rows:
        params.extend([save(value, conn) for save, value in zip(savers, values, strict=True)])
    values_sql = ", ".join([row] * len(rows))
    table = model._meta.db_table
    if guard:
        sql = (
            # SQL names from model metadata (constants); every value is a bound parameter.
            f'INSERT INTO "{table}" ({columns}) SELECT * FROM (VALUES {values_sql}) AS v WHERE {guard}'  # nosec B608
        )
    else:
        # SQL names from model metadata (constants); every value is a bound parameter.
        sql = f'INSERT INTO "{table}" ({columns}) VALUES {values_sql}'  # nosec B608
    if returning:
        sql += f' RETURNING "{model._meta.pk.column}"'  # type: ignore[union-attr]
    return sql, params


@lru_cache(maxsize=64)
def _update_row(model: type[models.Model], names: tuple[str, ...]) -> tuple[str, str, str]:
    """One typed VALUES row of an UPDATE (the key first), its column list and the SET clause."""
    fields, _ = _columns(model, names)
    row = "(%s::bigint, " + ", ".join(f"%s::{_cast(f)}" for f in fields) + ")"
    assignments = ", ".join(f'"{f.column}" = v."{f.column}"' for f in fields)
    value_columns = ", ".join(['"__pk"'] + [f'"{f.column}"' for f in fields])
    return row, value_columns, assignments


def update_statement(
    model: type[models.Model],
    objs: Sequence[models.Model],
    names: tuple[str, ...],
    *,
    guard: str = "",
) -> Statement | None:
    """One UPDATE of several rows, each with its own values."""
    if not objs:
        return None
    pk = model._meta.pk.column  # type: ignore[union-attr]
    row, value_columns, assignments = _update_row(model, names)
    savers = _savers(model, names, ())
    conn = connections[DEFAULT_DB_ALIAS]
    params: list[Any] = []
    for obj in objs:
        params.append(obj.pk)
        params.extend([save(getattr(obj, attname), conn) for attname, save in savers])
    sql = (
        # SQL names from model metadata (constants); every value is a bound parameter.
        f'UPDATE "{model._meta.db_table}" AS t SET {assignments} '
        f'FROM (VALUES {", ".join([row] * len(objs))}) AS v({value_columns}) WHERE t."{pk}" = v."__pk"'  # nosec B608
    )
    if guard:
        sql += f" AND {guard}"
    return sql, params


def one_round_trip() -> bool:
    """Whether `execute_batch` sends a batch as one query (client-side binding):
    then, outside a transaction, the server runs it as one implicit transaction."""
    return not connection.settings_dict.get("OPTIONS", {}).get("server_side_binding")


class _Literals:
    """How one driver connection turns values into SQL literals (the fast path's, or
    psycopg's), and which of our statements it has prepared."""

    def __init__(self, raw: Any):
        # Names of the statements prepared on this connection. After a failed batch
        # nobody knows which of its PREPAREs ran (they outlive a rollback): the
        # generation in the names moves on, so no name is ever prepared twice.
        self.prepared: set[str] = set()
        self.generation = 0
        self.literals = sql_literals.Literals(raw)


_literals: "weakref.WeakKeyDictionary[Any, _Literals]" = weakref.WeakKeyDictionary()


def _literals_of(raw: Any) -> _Literals:
    literals = _literals.get(raw)
    if literals is None:
        literals = _literals[raw] = _Literals(raw)
    return literals


def _bound(raw: Any, statements: Sequence[Statement]) -> str:
    """The statements joined, with their parameters bound as SQL literals.

    Exactly what psycopg's client-side binding sends (each value's literal, NULL
    for None; the common types quoted in Python by runtime/fastpaths/sql_literals.py),
    but the placeholders are filled by `bytes % tuple`:
    psycopg parses a query's placeholders in Python and caches that only for
    statements under 4 KB and 50 parameters, which a step's batch never is
    (~0.4 ms a step). The text is ours, so `%s` are its only placeholders and
    a literal `%` would be written `%%`, as for psycopg.
    """
    return _filled(raw, _literals_of(raw), [sql for sql, _ in statements], statements)


def _filled(
    raw: Any, literals: _Literals, texts: Sequence[str], statements: Sequence[Statement]
) -> str:
    """`texts` joined into one batch, their `%s` filled with the statements' values."""
    encoding = raw.info.encoding
    literal = literals.literals.for_batch(raw)
    values = tuple(b"NULL" if p is None else literal(p) for _, params in statements for p in params)
    template = ";\n".join(texts).encode(encoding)
    return (template % values).decode(encoding)


# Statements kept prepared on one connection; a batch that needs more starts the
# connection over (`_prepared_batch`). The texts vary only with row counts (events,
# calls of a step): the benchmark's loop settles at ~25 a connection, ~50 KB of
# server memory each.
PREPARED_PER_CONNECTION = 64
_PLACEHOLDER = re.compile(r"%%|%s")


# The text behind each digest, for whoever reads the batches this process sends
# (the benchmarks' SQL counter sees only `EXECUTE name(...)`).
_TEXTS: dict[str, str] = {}


def prepared_text(name: str) -> str | None:
    """The statement text a prepared statement's name (`ap<generation>_<digest>`)
    stands for, if this process prepared it."""
    return _TEXTS.get(name.partition("_")[2])


@lru_cache(maxsize=1024)
def _prepared_form(sql: str) -> tuple[str, str, str]:
    """(digest, `PREPARE` body, `EXECUTE` arguments) of a statement text.

    The digest of the text names the statement (`ap<generation>_<digest>`). The body numbers the `%s` as `$1`, `$2`,
    ... and keeps `%%` (the batch is still filled by `bytes % tuple`); the
    server infers each parameter's type from its place (a cast, a column, a
    function's argument), and each `EXECUTE` value is coerced to that type.
    """
    numbers = itertools.count(1)
    body = _PLACEHOLDER.sub(lambda m: m.group() if m.group() == "%%" else f"${next(numbers)}", sql)
    count = next(numbers) - 1
    digest = hashlib.blake2b(sql.encode(), digest_size=10).hexdigest()
    if len(_TEXTS) < 4096:
        _TEXTS[digest] = sql
    arguments = "(" + ", ".join(["%s"] * count) + ")" if count else ""
    return digest, body, arguments


@dataclass
class _PreparedBatch:
    text: str
    front: int  # results of the DEALLOCATE / PREPAREs before the statements' own
    prepared: set[str]  # what the connection holds once the batch has run


def _prepared_batch(
    raw: Any, literals: _Literals, statements: Sequence[Statement]
) -> _PreparedBatch:
    """The batch as `EXECUTE`s of prepared statements, preceded by a `PREPARE` of
    each this connection does not have yet.

    A connection full (PREPARED_PER_CONNECTION) starts over: the batch opens with
    `DEALLOCATE ALL` and prepares what it needs afresh, so a shape that turns up
    late (a step with more calls than before) is not sent as text for the rest of
    the connection's life; the hot texts are prepared again once each.
    """
    forms = [_prepared_form(sql) for sql, _ in statements]
    prefix = f"ap{literals.generation}_"
    held = literals.prepared
    missing = {prefix + digest for digest, _, _ in forms} - held
    front: list[str] = []
    if missing and len(held) + len(missing) > PREPARED_PER_CONNECTION:
        front.append("DEALLOCATE ALL")
        held = set()
    holds = set(held)
    texts: list[str] = []
    for (sql, _), (digest, body, arguments) in zip(statements, forms, strict=True):
        name = prefix + digest
        if name not in holds:
            if len(holds) >= PREPARED_PER_CONNECTION:
                texts.append(sql)  # more distinct texts than a connection keeps
                continue
            front.append(f"PREPARE {name} AS {body}")
            holds.add(name)
        texts.append(f"EXECUTE {name}{arguments}")
    # DEALLOCATE and PREPAREs take no values: the statements' values fill the EXECUTEs.
    return _PreparedBatch(_filled(raw, literals, front + texts, statements), len(front), holds)


def prepared_statements() -> bool:
    """Whether step batches are prepared on the server: they need one round trip
    (client-side binding) and a server that keeps a connection's session
    (PgBouncer in transaction mode does not: set DB_PREPARED_STATEMENTS=false)."""
    return bool(settings.DB_PREPARED_STATEMENTS) and one_round_trip()


def execute_batch(
    statements: Sequence[Statement | None], *, prepare: bool = False
) -> list[list[tuple[Any, ...]] | None]:
    """Run the statements in as few round trips as the driver allows; return
    each statement's rows (None for one that returns none), in order.

    `prepare`: every statement's parameters have a type the server can infer
    from their place (see `_prepared_form`); then each statement is prepared
    once per connection (`prepared_statements`).
    """
    real = [s for s in statements if s is not None]
    if not real:
        return []
    results: list[list[tuple[Any, ...]] | None] = []
    with connection.cursor() as cursor:
        if not one_round_trip():
            # Server-side binding allows one statement per execute.
            for sql, params in real:
                cursor.execute(sql, params)
                results.append(list(cursor.fetchall()) if cursor.description is not None else None)
            return results
        raw_connection = connection.connection
        literals = _literals_of(raw_connection)
        batch: _PreparedBatch | None = None
        if prepare and prepared_statements():
            batch = _prepared_batch(raw_connection, literals, real)
            text = batch.text
        else:
            text = _bound(raw_connection, real)
        try:
            # No parameters: psycopg sends the text as it is.
            cursor.execute(text)
        except Exception as error:
            # "prepared statement does not exist": something reset the session
            # (DISCARD ALL); this batch fails, the next prepares afresh.
            if (batch is not None and batch.front) or getattr(
                error.__cause__, "sqlstate", None
            ) == "26000":
                literals.prepared = set()
                literals.generation += 1
            raise
        raw = cursor.cursor
        if batch is not None:
            literals.prepared = batch.prepared
            for _ in range(batch.front):  # DEALLOCATE / PREPAREs: no rows
                cursor.nextset()
        while True:
            # The result's status, not `description`: that builds a column list
            # for each of the batch's results only to be tested against None.
            result = raw.pgresult
            rows = result is not None and result.status == pq.ExecStatus.TUPLES_OK
            results.append(list(cursor.fetchall()) if rows else None)
            if not cursor.nextset():
                return results
