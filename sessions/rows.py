"""Fast multi-row writes for the step transaction.

The ORM's bulk_create/bulk_update spend most of a step's CPU building queries
(DESIGN.md: ~3 ms a step through the ORM against ~0.8 ms in raw SQL). These
helpers build each statement's text once per model and field list, convert
values with the fields' own `get_db_prep_save`, and `execute_batch` sends all
of a step's writes in one round trip (psycopg binds client-side by default in
Django, so several statements can share one execute).
"""

import json
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


def insert_statement(
    model: type[models.Model],
    objs: Sequence[models.Model],
    names: tuple[str, ...],
    *,
    returning: bool = False,
) -> Statement | None:
    """One multi-row INSERT for the objects; with `returning`, it yields their primary keys."""
    if not objs:
        return None
    fields, columns = _columns(model, names)
    row = "(" + ", ".join(["%s"] * len(fields)) + ")"
    params: list[Any] = []
    for obj in objs:
        params.extend(f.get_db_prep_save(getattr(obj, f.attname), connection) for f in fields)
    sql = f'INSERT INTO "{model._meta.db_table}" ({columns}) VALUES {", ".join([row] * len(objs))}'
    if returning:
        sql += f' RETURNING "{model._meta.pk.column}"'  # type: ignore[union-attr]
    return sql, params


def update_statement(
    model: type[models.Model], objs: Sequence[models.Model], names: tuple[str, ...]
) -> Statement | None:
    """One UPDATE of several rows, each with its own values."""
    if not objs:
        return None
    fields, _ = _columns(model, names)
    pk = model._meta.pk.column  # type: ignore[union-attr]
    row = "(%s::bigint, " + ", ".join(f"%s::{f.db_type(connection)}" for f in fields) + ")"
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
    return sql, params


def execute_batch(statements: Sequence[Statement | None]) -> list[tuple[Any, ...]]:
    """Run the statements in as few round trips as the driver allows; return
    the rows of the first statement (put an INSERT ... RETURNING first)."""
    real = [s for s in statements if s is not None]
    if not real:
        return []
    with connection.cursor() as cursor:
        if connection.settings_dict.get("OPTIONS", {}).get("server_side_binding"):
            # Server-side binding allows one statement per execute.
            rows: list[tuple[Any, ...]] = []
            for i, (sql, params) in enumerate(real):
                cursor.execute(sql, params)
                if i == 0 and cursor.description is not None:
                    rows = list(cursor.fetchall())
            return rows
        cursor.execute(
            ";\n".join(sql for sql, _ in real), [p for _, params in real for p in params]
        )
        return list(cursor.fetchall()) if cursor.description is not None else []
