"""agentplatform.postgresql: the pool lends the connection returned last."""

from collections import deque

import pytest
from django.db import connection


def _backend_pid(conn: object) -> int:
    return conn.execute("SELECT pg_backend_pid()").fetchone()[0]  # type: ignore[attr-defined]


@pytest.mark.django_db(transaction=True)
def test_the_pool_lends_the_connection_returned_last() -> None:
    pool = connection.pool
    assert pool is not None, "the settings pool the default database"
    connection.ensure_connection()
    connection.close()  # back to the pool: the pool is open
    # Three at once, so the pool holds at least three; returned oldest-borrowed first.
    borrowed = [pool.getconn() for _ in range(3)]
    pids = [_backend_pid(conn) for conn in borrowed]
    for conn in borrowed:
        pool.putconn(conn)
    # Lent in turn, the next loan would be the one that has waited longest.
    again = pool.getconn()
    try:
        assert _backend_pid(again) == pids[-1]
    finally:
        pool.putconn(again)
    connection.ensure_connection()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        assert cursor.fetchone()[0] == pids[-1]
    connection.close()


def test_the_pool_keeps_its_own_order_when_psycopg_changes_its_internals() -> None:
    from agentplatform.postgresql.base import DatabaseWrapper
    from runtime.fastpaths.pool_order import LastReturnedFirst

    class Pool:
        _pool = ["not a deque"]

    wrapper = DatabaseWrapper.__new__(DatabaseWrapper)
    wrapper.alias = "default"
    wrapper.settings_dict = {"OPTIONS": {"pool": True}}
    DatabaseWrapper._connection_pools["__test__"] = Pool()  # type: ignore[attr-defined]
    try:
        wrapper.alias = "__test__"
        assert wrapper.pool._pool == ["not a deque"]
    finally:
        del DatabaseWrapper._connection_pools["__test__"]  # type: ignore[attr-defined]
    stack = LastReturnedFirst([1, 2])
    stack.append(3)
    assert stack.popleft() == 3 and isinstance(stack, deque)
