"""Fast multi-row writes for the step transaction.

The ORM's bulk_create/bulk_update spend most of a step's CPU building queries
(DESIGN.md: ~3 ms a step through the ORM against ~0.8 ms in raw SQL). These
helpers build each statement's text once per model and field list, convert
values with the fields' own `get_db_prep_save`, and `execute_batch` sends all
of a step's writes in one round trip (psycopg binds client-side by default in
Django, so several statements can share one execute).
"""

import json
import re
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from django.db import connection, models

Statement = tuple[str, list[Any]]


def json_value(value: Any) -> Any:
    """A jsonb column read with a raw cursor: Django's driver setup hands it over as text."""
    return json.loads(value) if isinstance(value, str) else value


@lru_cache(maxsize=64)
def _columns(model: type[models.Model], names: tuple[str, ...]) -> tuple[list[Any], str]:
    fields: list[Any] = [model._meta.get_field(name) for name in names]
    return fields, ", ".join(f'"{f.column}"' for f in fields)


def _cast(field: Any) -> str:
    # No length: an explicit cast to varchar(n) would truncate silently where
    # the INSERT's own assignment raises, as it always did.
    return re.sub(r"^(varchar|character varying)\(\d+\)$", "varchar", field.db_type(connection))


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
    if not objs:
        return None
    _, columns = _columns(model, names)
    fields, row = _row(model, names, now)
    params: list[Any] = []
    for obj in objs:
        params.extend(f.get_db_prep_save(getattr(obj, f.attname), connection) for f in fields)
    values = ", ".join([row] * len(objs))
    table = model._meta.db_table
    if guard:
        sql = (
            f'INSERT INTO "{table}" ({columns}) SELECT * FROM (VALUES {values}) AS v WHERE {guard}'
        )
    else:
        sql = f'INSERT INTO "{table}" ({columns}) VALUES {values}'
    if returning:
        sql += f' RETURNING "{model._meta.pk.column}"'  # type: ignore[union-attr]
    return sql, params


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
    fields, _ = _columns(model, names)
    pk = model._meta.pk.column  # type: ignore[union-attr]
    row = "(%s::bigint, " + ", ".join(f"%s::{_cast(f)}" for f in fields) + ")"
    params: list[Any] = []
    for obj in objs:
        params.append(obj.pk)
        params.extend(f.get_db_prep_save(getattr(obj, f.attname), connection) for f in fields)
    assignments = ", ".join(f'"{f.column}" = v."{f.column}"' for f in fields)
    value_columns = ", ".join(['"__pk"'] + [f'"{f.column}"' for f in fields])
    sql = (
        f'UPDATE "{model._meta.db_table}" AS t SET {assignments} '
        f'FROM (VALUES {", ".join([row] * len(objs))}) AS v({value_columns}) WHERE t."{pk}" = v."__pk"'
    )
    if guard:
        sql += f" AND {guard}"
    return sql, params


def one_round_trip() -> bool:
    """Whether `execute_batch` sends a batch as one query (client-side binding):
    then, outside a transaction, the server runs it as one implicit transaction."""
    return not connection.settings_dict.get("OPTIONS", {}).get("server_side_binding")


def execute_batch(statements: Sequence[Statement | None]) -> list[list[tuple[Any, ...]] | None]:
    """Run the statements in as few round trips as the driver allows; return
    each statement's rows (None for one that returns none), in order."""
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
        cursor.execute(
            ";\n".join(sql for sql, _ in real), [p for _, params in real for p in params]
        )
        while True:
            results.append(list(cursor.fetchall()) if cursor.description is not None else None)
            if not cursor.nextset():
                return results
