"""The connection pool lends the connection returned last.

psycopg's pool lends its connections in turn (first returned, first lent), so
one thread stepping a run lands each step on the backend that has waited
longest: its catalog and plan caches, its prepared step statements
(`record.rows`) and the CPU's own caches have gone cold since its last turn,
and every backend in the pool has to prepare every statement. Lending the last
returned keeps the busy set as small as the concurrency, which is why
PgBouncer lends its server connections the same way by default
(`server_round_robin = 0`). On the `langgraph` benchmark's loop, while a step
still gave its connection back twice an iteration, the wall time per
iteration fell ~3 % (bench/README.md).

It swaps psycopg_pool's internal deque (`_pool`, under `_lock`); the versions
it was written for are in runtime/fastpaths/__init__.py. Off, or on a pool
without that deque, the pool keeps its own order.
"""

from collections import deque
from typing import Any

from runtime import fastpaths


class LastReturnedFirst(deque[Any]):
    """psycopg_pool takes a connection with `popleft()` and returns one with `append()`.

    Taking from the right makes it a stack. The pool's shrinking also calls
    `popleft()`, so it now closes the connection used last instead of the one
    idle longest: either way the pool holds one fewer, and the next loan takes
    the one below it.
    """

    def popleft(self) -> Any:
        return self.pop()


def lend_last_returned(pool: Any) -> None:
    """Make `pool` (a psycopg_pool ConnectionPool) lend the connection returned last."""
    if pool is None or not fastpaths.enabled("pool_order"):
        return
    if type(getattr(pool, "_pool", None)) is deque:
        with pool._lock:
            if type(pool._pool) is deque:
                pool._pool = LastReturnedFirst(pool._pool)
