"""The per-owner filter still returns K items: 100,000 items of 1,000 owners (the exact path
every owner of that size takes), and a large owner whose own index is not built yet.
(A large owner through its own index: tests/memory/test_tasks.py.)"""

import random
import time
from contextlib import nullcontext

import pytest
from django.contrib.auth import get_user_model
from django.db import DatabaseError, connection, transaction
from django.test.utils import CaptureQueriesContext

from memory.models import MemoryItem, OwnerIndexState
from memory.selectors import memory_nearest, vector_literal
from memory.services import memory_owner_index_build

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


def _settings() -> tuple[str, str, str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT current_setting('enable_sort'), current_setting('hnsw.ef_search'), "
            "current_setting('hnsw.iterative_scan')"
        )
        row = cursor.fetchone()
    assert row is not None
    return row[0], row[1], row[2]


def test_a_small_owner_is_answered_in_one_round_trip():
    rng = random.Random(8)
    owner, nobody = _owners("one", 1)[0], _owners("none", 1)[0]
    _load(rng, [owner], 50)
    for owner_id, found in ((owner, K), (nobody, 0)):
        with CaptureQueriesContext(connection) as captured:
            hits = memory_nearest(owner_id=owner_id, vector=_unit(rng), model="bench", k=K)
        assert len(hits) == found
        assert len(captured.captured_queries) == 1, captured.captured_queries


@pytest.mark.django_db(transaction=True)
def test_a_large_owner_with_its_index_takes_two_round_trips_and_leaks_no_setting(settings):
    """Through its own index in two executes, equal to the exact scan, and the search's
    settings end with it: in autocommit, and inside a caller's transaction."""
    settings.MEMORY_EXACT_SCAN_MAX = 300
    rng = random.Random(34)
    big = _owners("large", 1)[0]
    _load(rng, [big], 400)
    _load(rng, _owners("others", 10), 500)
    record = memory_owner_index_build(owner_id=big, dims=DIMS)
    assert record.state == OwnerIndexState.READY
    defaults = _settings()
    assert defaults[0] == "on"
    for outer in (False, True):
        with transaction.atomic() if outer else nullcontext():
            for _ in range(5):
                query = _unit(rng)
                with CaptureQueriesContext(connection) as captured:
                    hits = memory_nearest(owner_id=big, vector=query, model="bench", k=K)
                assert len(captured.captured_queries) == 2, captured.captured_queries
                assert _settings() == defaults  # nothing left for the caller's next statement
                assert "ROLLBACK TO SAVEPOINT" in captured.captured_queries[1]["sql"] or not outer
                exact = memory_nearest(owner_id=big, vector=query, model="bench", k=K, path="exact")
                assert [h.item_id for h in hits] == [h.item_id for h in exact]
            assert _owner_of(hits) == {big}
        assert _settings() == defaults


@pytest.mark.django_db(transaction=True)
def test_a_failed_index_search_inside_a_transaction_leaves_no_setting_after_the_rollback(
    settings,
):
    """An error mid-way aborts the caller's transaction; its rollback undoes the settings."""
    settings.MEMORY_EXACT_SCAN_MAX = 300
    rng = random.Random(55)
    big = _owners("failing", 1)[0]
    _load(rng, [big], 400)
    memory_owner_index_build(owner_id=big, dims=DIMS)
    defaults = _settings()
    captured = CaptureQueriesContext(connection)
    with pytest.raises(DatabaseError, match="LIMIT"), transaction.atomic(), captured:
        # "index": the lookup passes, the search fails after its settings (LIMIT -1).
        memory_nearest(owner_id=big, vector=_unit(rng), model="bench", k=-1, path="index")
    assert "ROLLBACK TO SAVEPOINT" in captured.captured_queries[-1]["sql"]
    assert _settings() == defaults
