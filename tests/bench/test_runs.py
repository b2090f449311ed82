"""bench/runs.py: the database wait sampler sees a backend waiting for a row lock."""

import threading
import time

import pytest
from django.db import connection
from django.db.models import F

from bench.runs import DatabaseWaits
from record.models import Session

from ..factories import SessionFactory
from ..row_locks import session_row_locked

pytestmark = pytest.mark.django_db(transaction=True)


def _url() -> str:
    """The test database as this connection reaches it (psycopg's DSN leaves out the password)."""
    connection.ensure_connection()
    dsn = connection.connection.info.dsn
    password = connection.settings_dict["PASSWORD"]
    return f"{dsn} password={password}" if password else dsn


def _until_a_backend_waits_for_a_lock() -> None:
    """Sampling starts once the waiter is blocked, not while its UPDATE is on its way."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
            if cursor.fetchone()[0]:
                return
        time.sleep(0.01)
    raise AssertionError("the waiter never blocked on the row lock")


def test_a_backend_waiting_for_a_row_lock_is_counted_as_such() -> None:
    session = SessionFactory(state="idle")

    def wait_for_it() -> None:
        try:
            Session.objects.filter(pk=session.pk).update(step=F("step") + 1)
        finally:
            connection.close()

    waiter = threading.Thread(target=wait_for_it)
    sampler = DatabaseWaits(_url(), interval=0.02)
    with session_row_locked(session.pk):
        try:
            waiter.start()
            _until_a_backend_waits_for_a_lock()
            sampler.start()
            time.sleep(0.5)
        finally:
            figures = sampler.stop()
    waiter.join(10)

    assert figures["error"] is None
    assert figures["samples"] >= 5
    # Only the waiter is active (the holder is idle in its transaction): all its samples
    # are the row lock.
    assert figures["shares_pct"] == {"Lock/transactionid": 100.0}
    assert figures["row_lock_pct"] == 100.0 and figures["running_pct"] == 0.0
    assert figures["active_backends_mean"] == pytest.approx(1.0)
