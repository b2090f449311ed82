"""A large owner's own HNSW index: DDL for one partial expression index per owner and dimension.

Small owners (the common case) are scanned exactly and need no vector index; an
owner past the exact-scan limit gets
`hnsw ((embedding::vector(d)) vector_cosine_ops) WHERE owner_id = X AND dims = d
AND superseded_at IS NULL`, so its search walks a graph of its own items only
(recall does not depend on how many other owners there are). The index is built
with CREATE INDEX CONCURRENTLY: writes to the table go on during the build, so
these functions must run outside a transaction (a Celery task, after commit).
"""

from django.db import connection

from .models import MemoryItem

MAX_INDEXED_DIMENSION = 2000  # pgvector's HNSW limit for `vector`


def owner_index_name(owner_id: int, dims: int) -> str:
    return f"memory_owner_{int(owner_id)}_hnsw_{int(dims)}"


def owner_index_indexable(dims: int) -> bool:
    return 0 < dims <= MAX_INDEXED_DIMENSION


def _outside_transaction(what: str) -> None:
    if connection.in_atomic_block:
        raise RuntimeError(f"{what} runs CONCURRENTLY: call it outside a transaction")


def owner_index_valid(name: str) -> bool | None:
    """True: a usable index; False: a leftover of a failed concurrent build; None: no index."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT i.indisvalid FROM pg_class c JOIN pg_index i ON i.indexrelid = c.oid "
            "WHERE c.relname = %s AND c.relkind = 'i'",
            [name],
        )
        row = cursor.fetchone()
    return None if row is None else bool(row[0])


def owner_index_create(*, owner_id: int, dims: int, maintenance_work_mem: str) -> str:
    """Build the owner's index of `dims` unless a valid one exists; returns its name.

    1. A leftover invalid index (an interrupted concurrent build) is dropped first:
       `IF NOT EXISTS` would otherwise keep it, and the planner never uses it.
    2. CREATE INDEX CONCURRENTLY with a generous maintenance_work_mem (the graph
       is built in memory; past it the build slows down by an order of magnitude).
    """
    _outside_transaction("owner_index_create")
    if not owner_index_indexable(dims):
        raise ValueError(f"pgvector indexes at most {MAX_INDEXED_DIMENSION} dimensions")
    name = owner_index_name(owner_id, dims)
    table = MemoryItem._meta.db_table
    if owner_index_valid(name) is False:
        owner_index_drop(name=name)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT set_config('maintenance_work_mem', %s, false)", [maintenance_work_mem]
        )
        try:
            # Identifiers from the model and integers: the partial predicate must hold
            # literals, or the planner cannot match a query's `owner_id = X` to it.
            cursor.execute(
                f'CREATE INDEX CONCURRENTLY IF NOT EXISTS "{name}" ON "{table}" '
                f"USING hnsw ((embedding::vector({int(dims)})) vector_cosine_ops) "
                f"WHERE owner_id = {int(owner_id)} AND dims = {int(dims)} "
                "AND superseded_at IS NULL"
            )
        finally:
            cursor.execute("RESET maintenance_work_mem")
    return name


def owner_index_drop(*, name: str) -> None:
    """Drop an owner's index without blocking writes to the table."""
    _outside_transaction("owner_index_drop")
    with connection.cursor() as cursor:
        cursor.execute(f'DROP INDEX CONCURRENTLY IF EXISTS "{name}"')
