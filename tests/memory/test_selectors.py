"""The per-owner filter still returns K items: 100,000 items of 1,000 owners (the exact path
every owner of that size takes), and a large owner whose own index is not built yet.
(A large owner through its own index: tests/memory/test_tasks.py.)"""

import random
import time

import pytest
from django.contrib.auth import get_user_model
from django.db import connection

from memory.models import MemoryItem
from memory.selectors import memory_nearest, vector_literal

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


def test_a_large_owner_without_its_index_yet_is_scanned_exactly(settings):
    """Past the limit but no ready index (the build is queued): exact, never wrong."""
    settings.MEMORY_EXACT_SCAN_MAX = 300
    rng = random.Random(21)
    big = _owners("big", 1)[0]
    small = _owners("small", 20)
    _load(rng, [big], 400)
    _load(rng, small, 20 * 50)
    for _ in range(5):
        query = _unit(rng)
        exact = memory_nearest(owner_id=big, vector=query, model="bench", k=K, path="exact")
        for path in ("auto", "index"):
            hits = memory_nearest(owner_id=big, vector=query, model="bench", k=K, path=path)
            assert [h.item_id for h in hits] == [h.item_id for h in exact]
    assert len(exact) == K and _owner_of(exact) == {big}
    # An owner with nothing of this dimension gets nothing, through either path.
    nobody = _owners("nobody", 1)[0]
    assert memory_nearest(owner_id=nobody, vector=_unit(rng), model="bench", k=K) == []
