"""A large owner gets its own HNSW index through the real path: a write past the exact-scan
limit queues the Celery task, a real worker builds the index, search then goes through it
(the plan names it), and erasing the owner drops it."""

import random
import time

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from memory.index import owner_index_name
from memory.models import MemoryItem, MemoryOwnerIndex, OwnerIndexState
from memory.selectors import memory_nearest
from memory.services import memory_erase_owner, memory_remember
from tests.factories import UserFactory
from tests.memory.conftest import DIMENSION

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

LIMIT = 200
K = 10


def _vector(rng: random.Random) -> list[float]:
    return [rng.gauss(0, 1) for _ in range(DIMENSION)]


def _items(owner_id: int, n: int, rng: random.Random) -> None:
    MemoryItem.objects.bulk_create(
        [
            MemoryItem(
                owner_id=owner_id, content=f"item {i}", embedding=_vector(rng), dims=DIMENSION,
                embedding_model="fake-embed",
            )
            for i in range(n)
        ]
    )  # fmt: skip


def _indexes(owner_id: int) -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexname FROM pg_indexes WHERE indexname = %s",
            [owner_index_name(owner_id, DIMENSION)],
        )
        return [name for (name,) in cursor.fetchall()]


def _plan(owner_id: int, query: list[float]) -> str:
    """EXPLAIN of the very statement the production path sent, under the same settings."""
    with CaptureQueriesContext(connection) as captured:
        memory_nearest(owner_id=owner_id, vector=query, model="fake-embed", k=K)
    # The search is one execute of several statements (the settings, then the query):
    # the same execute again, with the query explained.
    statements = captured.captured_queries[-1]["sql"].split(";\n")
    at = next(i for i, statement in enumerate(statements) if "ORDER BY" in statement)
    statements[at] = "EXPLAIN " + statements[at]
    with connection.cursor() as cursor:
        cursor.execute(";\n".join(statements))
        for _ in range(at):
            cursor.nextset()
        return "\n".join(row[0] for row in cursor.fetchall())


def test_a_large_owner_gets_its_own_index_from_a_worker_and_search_uses_it(
    live_stack, embeddings, settings
):
    settings.MEMORY_EXACT_SCAN_MAX = LIMIT
    rng = random.Random(5)
    big, neighbour = UserFactory(), UserFactory()
    _items(big.pk, LIMIT, rng)
    _items(neighbour.pk, 300, rng)
    query = _vector(rng)
    # At the limit: scanned exactly, nothing queued.
    before = memory_nearest(owner_id=big.pk, vector=query, model="fake-embed", k=K)
    assert len(before) == K and not MemoryOwnerIndex.objects.exists()

    # The write that crosses the limit queues the build; the worker runs it.
    assert memory_remember(owner_id=big.pk, content="My dog is called Rex").action == "created"
    _items(big.pk, 100, rng)  # more items meanwhile: the concurrent build takes them too
    memory_remember(owner_id=big.pk, content="I live in Berlin")  # queues nothing more
    deadline = time.monotonic() + 60
    while not MemoryOwnerIndex.objects.filter(owner=big, state=OwnerIndexState.READY).exists():
        assert time.monotonic() < deadline, live_stack.log_tail("worker")
        time.sleep(0.2)
    record = MemoryOwnerIndex.objects.get(owner=big)
    assert record.name in _indexes(big.pk) and record.items_at_build >= LIMIT + 1
    assert MemoryOwnerIndex.objects.count() == 1  # the small neighbour has none

    # The production path goes through the owner's own index ...
    assert record.name in _plan(big.pk, query)
    assert record.name not in _plan(neighbour.pk, query)
    # ... and on a few hundred items finds exactly what the exact scan finds.
    for _ in range(10):
        query = _vector(rng)
        hits = memory_nearest(owner_id=big.pk, vector=query, model="fake-embed", k=K)
        exact = memory_nearest(owner_id=big.pk, vector=query, model="fake-embed", k=K, path="exact")
        assert [h.item_id for h in hits] == [h.item_id for h in exact]
        owners = set(
            MemoryItem.objects.filter(pk__in=[h.item_id for h in hits]).values_list(
                "owner_id", flat=True
            )
        )
        assert owners == {big.pk}  # the neighbour's items never come back

    # Erasing the owner drops the index and its record.
    memory_erase_owner(owner_id=big.pk)
    assert _indexes(big.pk) == [] and not MemoryOwnerIndex.objects.exists()
    assert memory_nearest(owner_id=big.pk, vector=query, model="fake-embed", k=K) == []
