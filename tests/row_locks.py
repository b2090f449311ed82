"""A session row held locked by another connection, as a step commit in flight holds it."""

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db import connection, transaction
from django.db.models import F

from sessions.models import Session


@contextmanager
def session_row_locked(session_id: Any) -> Iterator[None]:
    """Inside, a thread's open transaction has updated the row (a transactional test's
    own connection is not that thread's, so the lock is a real other backend's)."""
    locked, release = threading.Event(), threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic():
                Session.objects.filter(pk=session_id).update(step=F("step") + 1)
                locked.set()
                release.wait(30)
        finally:
            connection.close()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert locked.wait(10), "the row lock was not taken"
        yield
    finally:
        release.set()
        holder.join(10)
