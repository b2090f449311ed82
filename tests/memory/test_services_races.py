"""Two memories of one subject arriving at once for one owner: exactly one stays live, the
other is its history. Real concurrent database connections, the offline embedder."""

import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection

from memory.decision import Decision
from memory.models import MemoryItem, MemoryVersion
from memory.services import memory_remember
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db(transaction=True)


def _concurrently(*calls: Callable[[], Any]) -> list[Any]:
    """Run each call on its own thread (and database connection), released together."""
    barrier = threading.Barrier(len(calls))
    results: list[Any] = [None] * len(calls)

    def run(i: int, call: Callable[[], Any]) -> None:
        try:
            barrier.wait()
            results[i] = call()
        except Exception as exc:  # noqa: BLE001 - the outcome is what the test compares
            results[i] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return results


def _one_live_value(owner_id: int, values: set[str]) -> None:
    live = list(MemoryItem.objects.filter(owner_id=owner_id, superseded_at__isnull=True))
    assert len(live) == 1 and live[0].content in values
    # The other value is not lost: it is a version of the live item.
    assert (
        set(MemoryVersion.objects.filter(item=live[0]).values_list("content", flat=True)) == values
    )


@pytest.mark.parametrize("lock", ["owner lock", "constraint only"])
@pytest.mark.parametrize("attempt", range(3))
def test_two_values_of_one_subject_at_once_leave_one_live(lock, attempt, monkeypatch):
    if lock == "constraint only":
        # Without the lock the unique live-subject constraint still refuses the second
        # insert, and the loser updates the winner's item instead.
        monkeypatch.setattr("memory.services._owner_lock", lambda owner_id: None)
    owner, other = UserFactory(), UserFactory()
    memory_remember(owner_id=other.pk, content="My favourite colour is green")
    results = _concurrently(
        lambda: memory_remember(owner_id=owner.pk, content="My favourite colour is blue"),
        lambda: memory_remember(owner_id=owner.pk, content="My favourite colour is red"),
    )
    assert not [r for r in results if isinstance(r, Exception)], results
    assert sorted(r.action for r in results) == ["created", "updated"]
    _one_live_value(owner.pk, {"My favourite colour is blue", "My favourite colour is red"})
    assert MemoryItem.objects.get(owner=other).content == "My favourite colour is green"


@pytest.mark.parametrize("attempt", range(3))
def test_a_model_add_decided_before_a_concurrent_write_becomes_an_update(attempt):
    """The model decided "add" while another write of the subject was on its way: applied
    under the lock, it finds the live item and updates it."""
    owner = UserFactory()
    add = Decision("add", None, "Favourite colour: teal", "favourite colour", "model: add")
    results = _concurrently(
        lambda: memory_remember(owner_id=owner.pk, content="My favourite colour is blue"),
        lambda: memory_remember(
            owner_id=owner.pk, content="", decision=add, decided_by="model:cheap"
        ),
    )
    assert not [r for r in results if isinstance(r, Exception)], results
    _one_live_value(owner.pk, {"My favourite colour is blue", "Favourite colour: teal"})
