"""Rows held locked by another connection, as a step commit in flight holds them."""

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from django.db import connection, transaction
from django.db.models import F

from record.models import Session


@contextmanager
def held_in_transaction(work: Callable[[], Any]) -> Iterator[None]:
    """Inside, a thread's open transaction has run `work` and holds the row locks it took
    (a transactional test's own connection is not that thread's: another backend's)."""
    locked, release = threading.Event(), threading.Event()
    failed: list[BaseException] = []

    def hold() -> None:
        try:
            with transaction.atomic():
                work()
                locked.set()
                release.wait(30)
        except BaseException as error:  # noqa: BLE001 - reported by the waiting side
            failed.append(error)
            locked.set()
        finally:
            connection.close()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert locked.wait(10) and not failed, failed or "the row locks were not taken"
        yield
    finally:
        release.set()
        holder.join(10)


def session_row_locked(session_id: Any) -> Any:
    """The session row held locked (updated in a transaction not yet committed)."""
    return held_in_transaction(
        lambda: Session.objects.filter(pk=session_id).update(step=F("step") + 1)
    )
