"""Django's PostgreSQL backend, with a pool that lends the connection returned last
(a fast path: runtime/fastpaths/pool_order.py)."""

from typing import Any

from django.db.backends.postgresql import base

from runtime.fastpaths.pool_order import lend_last_returned


class DatabaseWrapper(base.DatabaseWrapper):
    @property
    def pool(self) -> Any:
        pool = super().pool
        lend_last_returned(pool)
        return pool
