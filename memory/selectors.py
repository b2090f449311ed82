"""Reading memory: the owner's nearest items, ranked for a turn, and the context block.

The owner filter must still return K items, with recall@10 >= 0.95. One global
HNSW index with a filter cannot promise that: its graph is everyone's items, and
at 0.1 % selectivity even pgvector's iterative scan found only ~38 % of an
owner's true top 10. So:
- an owner with at most `settings.MEMORY_EXACT_SCAN_MAX` live items of the
  dimension (the common case) is scanned exactly through the (owner, dims)
  index: every item, exact order, recall 1.0, one round trip;
- a larger owner has its own partial HNSW index (memory/index.py, built by a
  Celery task once a write crosses the limit, recorded in MemoryOwnerIndex):
  its graph holds that owner's items only, searched with a wide candidate list
  (`MEMORY_HNSW_EF_SEARCH`) and re-sorted by exact distance. Until the index is
  ready the owner is scanned exactly: slower, never wrong.
bench/memory_search.py measures both kinds of owner (p95 and recall@10).
"""

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg
from django.conf import settings
from django.db import connection
from django.utils import timezone

from .decision import Neighbour
from .models import MemoryItem, MemoryOwnerIndex, MemoryVersion, OwnerIndexState, VersionAction
from .scoring import DEFAULT_HALF_LIFE_DAYS, memory_score

# With a tag filter the owner's graph may hold fewer matching rows near the query
# than K: the iterative scan keeps walking, up to this many tuples.
ITERATIVE_MAX_SCAN_TUPLES = 40000


def exact_scan_max() -> int:
    """Read per call, so tests (and operators, through the environment) can move it."""
    return int(settings.MEMORY_EXACT_SCAN_MAX)


@dataclass(frozen=True)
class Hit:
    item_id: int
    similarity: float


def vector_literal(vector: Sequence[float]) -> str:
    return "[" + ",".join(f"{x:.7g}" for x in vector) + "]"


def memory_owner_live_count(*, owner_id: int, dims: int, limit: int) -> int:
    """The owner's live items of `dims`, counted up to `limit` (an index-only, bounded scan)."""
    table = MemoryItem._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            # SQL names from model metadata; every value is a bound parameter.
            f'SELECT count(*) FROM (SELECT 1 FROM "{table}" WHERE owner_id = %s AND dims = %s '  # nosec B608
            "AND superseded_at IS NULL LIMIT %s) s",
            [owner_id, dims, limit],
        )
        row = cursor.fetchone()
    return int(row[0]) if row else 0


def _large_owner_index(owner_id: int, dims: int, limit: int) -> tuple[bool, str | None]:
    """(is the owner past the limit, the name of its ready index or None): one round trip."""
    items = MemoryItem._meta.db_table
    indexes = MemoryOwnerIndex._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            # SQL names from model metadata; every value is a bound parameter.
            f'SELECT (SELECT count(*) FROM (SELECT 1 FROM "{items}" WHERE owner_id = %s '  # nosec B608
            "AND dims = %s AND superseded_at IS NULL LIMIT %s) s), "
            f'(SELECT name FROM "{indexes}" WHERE owner_id = %s AND dims = %s AND state = %s)',
            [owner_id, dims, limit + 1, owner_id, dims, OwnerIndexState.READY],
        )
        row = cursor.fetchone()
    if row is None:
        return False, None
    return int(row[0]) > limit, row[1]


@dataclass(frozen=True)
class _LargeOwner:
    """The first statement's marker: the owner is past the limit; its ready index or None."""

    index: str | None


def memory_nearest(
    *,
    owner_id: int,
    vector: Sequence[float],
    model: str,
    k: int = 10,
    tags: Sequence[str] = (),
    path: str = "auto",
) -> list[Hit]:
    """The owner's K live items nearest to `vector` (cosine), embedded by `model`.

    `path`: "auto", "exact" or "index" (the owner's own index; exact without one).
    1. "auto" sends one statement: a small owner's exact top K, or for an owner
       past the limit a marker row carrying the name of its ready index (or
       none). A small owner is answered in this one round trip.
    2. A large owner with a ready index is searched through it: one more round
       trip (the settings and the query in one execute, `_index_search`).
    3. One without (the build is queued or running) is scanned exactly.
    """
    limit = exact_scan_max()
    dims = len(vector)
    if path == "auto":
        first = _auto_first(owner_id, vector, model, k, tags, limit)
        if not isinstance(first, _LargeOwner):
            return first
        path = "index" if first.index else "exact"
    elif path == "index":
        _, index = _large_owner_index(owner_id, dims, limit)
        path = "index" if index else "exact"
    sql, params = _nearest_sql(owner_id, vector, model, k, tags, exact=path == "exact")
    if path == "exact":
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            rows = cursor.fetchall()
    else:
        rows = _index_search(sql, params, k)
    return _hits(rows)


def _hits(rows: Sequence[Sequence[Any]]) -> list[Hit]:
    hits = [Hit(int(i), float(sim)) for i, sim in rows]
    # relaxed_order may return rows slightly out of order.
    hits.sort(key=lambda h: -h.similarity)
    return hits


def _nearest_sql(
    owner_id: int,
    vector: Sequence[float],
    model: str,
    k: int,
    tags: Sequence[str],
    *,
    exact: bool,
    guard: int | None = None,
) -> tuple[str, list[Any]]:
    """The owner's top-K statement; `guard`: only while the owner has at most that many items."""
    dims = len(vector)
    table = MemoryItem._meta.db_table
    distance = f"(embedding::vector({dims}) <=> %s::vector({dims}))"
    # `+ 0` makes the ORDER BY an expression no index provides: the planner reads
    # the owner's rows through the owner index and sorts them exactly.
    order = f"{distance} + 0" if exact else distance
    tag_filter = "AND tag = ANY(%s)" if tags else ""
    literal = vector_literal(vector)
    params: list[Any] = [literal, model]
    if tags:
        params.append(list(tags))
    # An uncorrelated subquery: an InitPlan, so a large owner's rows are never scanned.
    guard_sql = f"AND (SELECT n FROM live) <= {int(guard)}" if guard is not None else ""
    params += [literal, k]
    # The owner and dimension are integers written into the text: the owner's partial
    # index (WHERE owner_id = X AND dims = d) is usable only when the planner sees the
    # literals. The distance, order and filters are built above; values are bound.
    sql = (
        f'SELECT id, 1 - {distance} FROM "{table}" '  # nosec B608
        f"WHERE owner_id = {int(owner_id)} AND dims = {dims} AND superseded_at IS NULL "
        f"AND embedding_model = %s {tag_filter} {guard_sql} ORDER BY {order} LIMIT %s"
    )
    return sql, params


def _auto_first(
    owner_id: int,
    vector: Sequence[float],
    model: str,
    k: int,
    tags: Sequence[str],
    limit: int,
) -> list[Hit] | _LargeOwner:
    """One round trip: a small owner's exact top K, or the marker of a large owner.

    The bounded count (`live`, at most limit + 1 index entries) guards both
    branches: at most `limit` items, the exact scan runs; past it, the scan is
    skipped (a one-time filter) and a single row with a NULL id carries the
    owner's ready index name, or NULL while it is being built.
    """
    dims = len(vector)
    items = MemoryItem._meta.db_table
    indexes = MemoryOwnerIndex._meta.db_table
    exact_sql, params = _nearest_sql(owner_id, vector, model, k, tags, exact=True, guard=limit)
    # SQL names from model metadata and integer constants; values are bound parameters.
    sql = (
        f'WITH live AS (SELECT count(*) AS n FROM (SELECT 1 FROM "{items}" '  # nosec B608
        f"WHERE owner_id = {int(owner_id)} AND dims = {dims} AND superseded_at IS NULL "
        f"LIMIT {int(limit) + 1}) s) "
        f"SELECT top.*, NULL::text FROM ({exact_sql}) top "
        "UNION ALL "
        f'SELECT NULL, NULL, (SELECT name FROM "{indexes}" WHERE owner_id = {int(owner_id)} '
        f"AND dims = {dims} AND state = %s) FROM live WHERE n > {int(limit)}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [*params, OwnerIndexState.READY])
        rows = cursor.fetchall()
    if len(rows) == 1 and rows[0][0] is None:
        return _LargeOwner(index=rows[0][2])
    return _hits([(i, sim) for i, sim, _ in rows])


def _index_search(sql: str, params: list[Any], k: int) -> list[tuple[Any, ...]]:
    """Run `sql` under the owner-index settings in one round trip, the settings never outliving it.

    `set_config(..., true)` lasts until the end of the current transaction, which
    may be a caller's: a savepoint released would keep the settings for the rest
    of it (and for whoever borrows the pooled connection inside it). So the
    statements go in one execute (client-side binding: the simple query protocol,
    several statements, one round trip):
    1. Outside any transaction, the settings and the query only: PostgreSQL runs
       a multi-statement string as one implicit transaction, which ends with it.
    2. Inside one (an atomic block, or a transaction psycopg is about to open),
       the settings and the query between SAVEPOINT and ROLLBACK TO SAVEPOINT:
       the rollback undoes the settings (the query wrote nothing), the RELEASE
       leaves the caller's transaction as it was. An error aborts the caller's
       transaction, whose rollback undoes them too.
    """
    settings_sql, settings_params = owner_index_settings(k)
    connection.ensure_connection()
    raw = connection.connection
    standalone = (
        raw is not None
        and raw.autocommit
        and raw.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    )
    if standalone:
        statements, query_at = [settings_sql, sql], 1
    else:
        statements = [
            f"SAVEPOINT {_SAVEPOINT}",
            settings_sql,
            sql,
            f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}",
            f"RELEASE SAVEPOINT {_SAVEPOINT}",
        ]
        query_at = 2
    with connection.cursor() as cursor:
        cursor.execute(";\n".join(statements), [*settings_params, *params])
        for _ in range(query_at):
            cursor.nextset()
        return list(cursor.fetchall())


_SAVEPOINT = "memory_owner_index_search"


def owner_index_settings(k: int) -> tuple[str, list[Any]]:
    """The transaction-local settings of a search through an owner's index, as one statement.

    The HNSW scan yields rows in order; a plan through the owner btree must sort:
    sorting disabled, the planner takes the HNSW scan it might otherwise skip.
    """
    ef_search = max(int(settings.MEMORY_HNSW_EF_SEARCH), 2 * k)
    return (
        "SELECT set_config('hnsw.iterative_scan', 'relaxed_order', true), "
        "set_config('hnsw.max_scan_tuples', %s, true), "
        "set_config('hnsw.ef_search', %s, true), "
        "set_config('enable_sort', 'off', true)",
        [str(ITERATIVE_MAX_SCAN_TUPLES), str(min(ef_search, 1000))],
    )


def memory_owner_items_sql(owner: str) -> str:
    """`memory_owner_has_items` as an SQL expression of the owner's id `owner` (a column or
    a placeholder): the engine asks it in the round trip that takes a run's lease."""
    return (
        f"EXISTS (SELECT 1 FROM {MemoryItem._meta.db_table} "  # nosec B608 - a model's table
        f"WHERE owner_id = {owner} AND superseded_at IS NULL)"
    )


def memory_owner_has_items(owner_id: int) -> bool:
    """Most owners have no memory: one cheap query spares them an embedding call per turn.

    Asked once a turn: written out, it costs a quarter of the ORM's compiled
    `exists()` in CPU (0.06 against 0.27 ms).
    """
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {memory_owner_items_sql('%s')}", [owner_id])  # nosec B608
        row = cursor.fetchone()
    return bool(row[0])


def memory_neighbours(
    *, owner_id: int, vector: Sequence[float], model: str, k: int, subject: str = ""
) -> tuple[list[Neighbour], Neighbour | None]:
    """What a new memory is compared with: the owner's K nearest live items, and the
    owner's live item of `subject` (found by subject, however far its vector)."""
    hits = memory_nearest(owner_id=owner_id, vector=vector, model=model, k=k) if vector else []
    similarity = {h.item_id: h.similarity for h in hits}
    items = MemoryItem.objects.filter(owner_id=owner_id, superseded_at__isnull=True)
    wanted = items.filter(pk__in=list(similarity))
    if subject:
        wanted = wanted | items.filter(subject=subject)
    found = {
        row.pk: Neighbour(
            id=row.pk,
            content=row.content,
            subject=row.subject,
            tag=row.tag,
            similarity=similarity.get(row.pk, 0.0),
            updated_at=row.updated_at,
        )
        for row in wanted.only("content", "subject", "tag", "updated_at")
    }
    current = next((n for n in found.values() if subject and n.subject == subject), None)
    ordered = [found[h.item_id] for h in hits if h.item_id in found]
    return ordered, current


def memory_written_since(
    *, owner_id: int, session_id: Any, since: datetime, k: int
) -> tuple[list[Neighbour], set[int]]:
    """The owner's live items a session changed since `since` (a turn's `remember` calls and
    "remember that ..."), each with its K nearest live items: what a reviewer of those
    writes must see. Returns (the items, the ids of those changed)."""
    changed = list(
        MemoryItem.objects.filter(
            owner_id=owner_id,
            superseded_at__isnull=True,
            versions__source_session_id=session_id,
            versions__created_at__gte=since,
        )
        .distinct()
        .only("content", "subject", "tag", "updated_at", "embedding", "embedding_model")
    )
    found: dict[int, Neighbour] = {}
    for item in changed:
        if item.embedding is not None:
            near, _ = memory_neighbours(
                owner_id=owner_id, vector=list(item.embedding), model=item.embedding_model, k=k
            )
            found.update((n.id, n) for n in near)
        found.setdefault(
            item.pk, Neighbour(item.pk, item.content, item.subject, item.tag, 1.0, item.updated_at)
        )
    return list(found.values()), {item.pk for item in changed}


@dataclass(frozen=True)
class Earlier:
    """A value an item held before its latest, and when it was written."""

    content: str
    at: datetime


@dataclass
class RankedItem:
    item: MemoryItem
    similarity: float
    score: float
    before: list[Earlier] = field(default_factory=list)


def memory_earlier(*, owner_id: int, items: Sequence[MemoryItem]) -> dict[int, list[Earlier]]:
    """What each item said before its latest value, newest first.

    1. Its own versions, other than the latest text (updates are made in place).
    2. Items superseded on its subject before versions were kept (a value was then a
       new row): their text and when they were written.
    """
    earlier: dict[int, list[Earlier]] = {item.pk: [] for item in items}
    if not items:
        return earlier
    for item_id, content, at in (
        MemoryVersion.objects.filter(owner_id=owner_id, item_id__in=list(earlier))
        .exclude(action=VersionAction.DELETED)
        .order_by("-id")
        .values_list("item_id", "content", "created_at")
    ):
        earlier[item_id].append(Earlier(content, at))
    by_subject = {item.subject: item.pk for item in items if item.subject}
    if by_subject:
        for subject, content, at in (
            MemoryItem.objects.filter(
                owner_id=owner_id, subject__in=list(by_subject), superseded_by__isnull=False
            )
            .order_by("-created_at")
            .values_list("subject", "content", "created_at")
        ):
            earlier[by_subject[subject]].append(Earlier(content, at))
    current = {item.pk: " ".join(item.content.split()) for item in items}
    for item_id, values in earlier.items():
        seen = {current[item_id]}
        kept: list[Earlier] = []
        for value in values:
            text = " ".join(value.content.split())
            if text not in seen:  # the latest text, and a value said twice, once
                seen.add(text)
                kept.append(value)
        earlier[item_id] = kept
    return earlier


def memory_ranked(
    *,
    owner_id: int,
    vector: Sequence[float],
    model: str,
    k: int = 5,
    tags: Sequence[str] = (),
    min_similarity: float = 0.0,
    half_life_days: float = DEFAULT_HALF_LIFE_DAYS,
    now: datetime | None = None,
) -> list[RankedItem]:
    """The owner's top K live items by similarity x time decay x importance, with what they
    said before.

    1. Take 4K nearest candidates (the decay and importance reorder them).
    2. Score, keep the best K above `min_similarity`.
    3. Attach each kept item's earlier values, newest first (memory_earlier).
    """
    now = now or timezone.now()
    hits = memory_nearest(owner_id=owner_id, vector=vector, model=model, k=4 * k, tags=tags)
    hits = [h for h in hits if h.similarity >= min_similarity]
    items = MemoryItem.objects.in_bulk([h.item_id for h in hits])
    ranked = [
        RankedItem(
            item=item,
            similarity=h.similarity,
            score=memory_score(
                similarity=h.similarity,
                used_at=item.updated_at,
                now=now,
                importance=item.importance,
                half_life_days=half_life_days,
            ),
        )
        for h in hits
        if (item := items.get(h.item_id)) is not None
    ]
    ranked.sort(key=lambda r: -r.score)
    ranked = ranked[:k]
    earlier = memory_earlier(owner_id=owner_id, items=[r.item for r in ranked])
    for r in ranked:
        r.before = earlier.get(r.item.pk, [])
    return ranked


BEFORE_SHOWN = 2  # earlier values per item in the model's context


def memory_block(ranked: Sequence[RankedItem]) -> str:
    """The compact lines the model gets before the conversation; "" when there is nothing.

    An item that changed reads "latest: <now> (before: <earlier>, <date>; ...)", the
    date being when the earlier value was written. No heading: the context assembly
    puts the memory partition's one heading above them (engine/model/context.py).
    """
    if not ranked:
        return ""
    lines: list[str] = []
    for r in ranked:
        about = f" {r.item.subject}:" if r.item.subject else ""
        line = f"- [{r.item.tag}]{about} "
        if r.before:
            earlier = "; ".join(f"{e.content}, {e.at:%Y-%m-%d}" for e in r.before[:BEFORE_SHOWN])
            line += f"latest: {r.item.content} (before: {earlier})"
        else:
            line += r.item.content
        lines.append(line)
    return "\n".join(lines)


def memory_as_data(ranked: Sequence[RankedItem]) -> list[dict[str, object]]:
    """What `recall` returns for memory items."""
    return [
        {
            "id": r.item.pk,
            "content": r.item.content,
            "tag": r.item.tag,
            "subject": r.item.subject,
            "updated_at": r.item.updated_at.isoformat(),
            "similarity": round(r.similarity, 3),
            **(
                {"before": [{"content": e.content, "at": e.at.isoformat()} for e in r.before]}
                if r.before
                else {}
            ),
        }
        for r in ranked
    ]
