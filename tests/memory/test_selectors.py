"""The per-owner filter still returns K items: 100,000 items of 1,000 owners (the exact path
every owner of that size takes), and a large owner through HNSW with the iterative scan."""

import random
import time

import pytest
from django.contrib.auth import get_user_model
from django.db import connection, transaction

from memory.index import memory_index_ensure
from memory.models import MemoryItem
from memory.selectors import EXACT_SCAN_MAX, memory_nearest, vector_literal

pytestmark = pytest.mark.django_db

DIMS = 16  # no index of this dimension during the load: COPY stays fast
K = 10


def _unit(rng: random.Random) -> list[float]:
    v = [rng.gauss(0, 1) for _ in range(DIMS)]
    norm = sum(x * x for x in v) ** 0.5
    return [x / norm for x in v]


def _load(rng: random.Random, owners: list[int], items: int) -> None:
    """`items` random unit vectors, round-robin over `owners`, written with COPY."""
    table = MemoryItem._meta.db_table
    with connection.cursor() as cursor:
        with cursor.copy(
            f'COPY "{table}" (owner_id, tag, subject, content, embedding, dims, embedding_model, '
            "importance, confidence, source, source_key, created_at, updated_at) FROM STDIN"
        ) as copy:
            for i in range(items):
                copy.write_row(
                    (
                        owners[i % len(owners)], "fact", "", f"item {i}",
                        vector_literal(_unit(rng)), DIMS, "bench", 0.5, 0.8, "tool", "",
                        "2026-01-01T00:00:00Z", "2026-01-01T00:00:00Z",
                    )
                )  # fmt: skip
        # The owner FKs are deferred: check them now, or CREATE INDEX refuses the table.
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        cursor.execute(f'ANALYZE "{table}"')


def _owners(prefix: str, n: int) -> list[int]:
    User = get_user_model()
    User.objects.bulk_create([User(username=f"{prefix}{i}") for i in range(n)])
    return list(User.objects.filter(username__startswith=prefix).values_list("pk", flat=True))


def _owner_of(hits: list) -> set[int]:  # type: ignore[type-arg]
    return set(
        MemoryItem.objects.filter(pk__in=[h.item_id for h in hits]).values_list(
            "owner_id", flat=True
        )
    )


def test_100k_items_of_1000_owners_every_owner_gets_k_of_its_own():
    rng = random.Random(13)
    owners = _owners("crowd", 1000)
    _load(rng, owners, 100_000)
    elapsed = []
    for owner_id in rng.sample(owners, 50):
        query = _unit(rng)
        started = time.perf_counter()
        hits = memory_nearest(owner_id=owner_id, vector=query, model="bench", k=K)
        elapsed.append(time.perf_counter() - started)
        assert len(hits) == K
        assert _owner_of(hits) == {owner_id}  # another owner's item never comes back
        exact = memory_nearest(owner_id=owner_id, vector=query, model="bench", k=K, path="exact")
        assert [h.item_id for h in hits] == [h.item_id for h in exact]  # recall 1.0
    elapsed.sort()
    assert elapsed[len(elapsed) // 2] < 0.1, elapsed  # generous: a shared, loaded machine


def test_a_large_owner_goes_through_hnsw_with_the_iterative_scan():
    """One owner past EXACT_SCAN_MAX among small ones: the index path, which keeps K and
    recall; a plain filtered HNSW scan (no iterative scan) loses rows."""
    rng = random.Random(21)
    big = _owners("big", 1)[0]
    small = _owners("small", 40)
    _load(rng, [big], EXACT_SCAN_MAX + 500)
    _load(rng, small, 40 * 250)
    memory_index_ensure(dimension=DIMS)
    recalls = []
    for _ in range(20):
        query = _unit(rng)
        hits = memory_nearest(owner_id=big, vector=query, model="bench", k=K)  # auto: index
        exact = memory_nearest(owner_id=big, vector=query, model="bench", k=K, path="exact")
        assert len(hits) == K and _owner_of(hits) == {big}
        recalls.append(len({h.item_id for h in hits} & {h.item_id for h in exact}) / K)
    assert sum(recalls) / len(recalls) >= 0.95, recalls
    # A small owner through the index: 250 of 12,500 rows; the iterative scan still finds K.
    query = _unit(rng)
    forced = memory_nearest(owner_id=small[0], vector=query, model="bench", k=K, path="index")
    assert len(forced) == K and _owner_of(forced) == {small[0]}
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL hnsw.iterative_scan = off")
        cursor.execute("SET LOCAL enable_sort = off")
        cursor.execute(
            f'SELECT id FROM "{MemoryItem._meta.db_table}" WHERE owner_id = %s AND dims = {DIMS} '
            f"AND superseded_at IS NULL ORDER BY embedding::vector({DIMS}) <=> %s::vector({DIMS}) "
            "LIMIT %s",
            [small[0], vector_literal(query), K],
        )
        assert len(cursor.fetchall()) < K
