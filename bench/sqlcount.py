"""Counting what the engine sends to PostgreSQL, per thread.

Four separate counts (issue 10 item 7: a batched write is one round trip but
several statements, and the driver's `rowcount` only covers the last one):

- Round trips: a Django `execute_wrapper` on every connection, installed from
  the `connection_created` signal (with the psycopg pool a thread's wrapper
  reconnects after each `connection.close()`, and tool handlers run on helper
  threads with connections of their own). Each `execute` / `executemany` is
  one round trip; so is each COMMIT / ROLLBACK, and the BEGIN psycopg sends
  before a transaction's first statement (`tx_round_trips`).
- Statements: each statement of an `execute` (a batch from
  `record.rows.execute_batch` is several, joined by ";\n"; one result set
  each); `executemany` counts one per parameter set. A prepared batch's
  `EXECUTE name(values)` is counted as the statement it runs (its text from
  `record.rows.prepared_text`); its `PREPARE`s are counted apart (`prepares`).
- Rows written: the affected-row count of every result of the execute (each
  statement of a batch, read from psycopg's results), by table.
- Commits: explicit ones are counted by wrapping `DatabaseWrapper.commit`,
  which `transaction.atomic` calls when its outermost block exits. A write
  statement run outside any atomic block is its own transaction in
  autocommit mode, so it counts as one (implicit) commit too. Reads outside
  a transaction are round trips, not commits here; the server counts each as
  a transaction (`xact_commit`), which `server_counters` reports.

Cross-check: `server_counters(database)` reads `pg_stat_database` (transactions,
rows) and `pg_stat_user_tables` (rows inserted / updated / deleted per table)
for a database; the benchmarks print both.

Nothing here sees statements that psycopg or the pool send by themselves
(none are configured: no `check`, no `reset`), nor the Celery broker and
channel-layer traffic to Redis.
"""

import re
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

WRITE_VERBS = {"INSERT", "UPDATE", "DELETE"}


_DICTS = ("by_verb", "rows_by_table", "seconds_by_table")


@dataclass
class Tally:
    statements: int = 0
    round_trips: int = 0
    reads: int = 0
    writes: int = 0
    rows_written: int = 0
    explicit_commits: int = 0
    autocommit_writes: int = 0
    rollbacks: int = 0
    savepoints: int = 0
    prepares: int = 0  # PREPAREs (a text once per connection) and DEALLOCATEs (record/rows.py)
    db_seconds: float = 0.0
    by_verb: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    rows_by_table: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    seconds_by_table: dict[str, float] = field(default_factory=lambda: defaultdict(float))

    @property
    def commits(self) -> int:
        return self.explicit_commits + self.autocommit_writes

    @property
    def all_round_trips(self) -> int:
        """Executes plus each transaction's BEGIN and COMMIT / ROLLBACK."""
        return self.round_trips + 2 * (self.explicit_commits + self.rollbacks)

    def _combine(self, other: "Tally", sign: int) -> "Tally":
        out = Tally(
            **{
                k: getattr(self, k) + sign * getattr(other, k)
                for k in self.__dict__
                if k not in _DICTS
            }
        )
        for name in _DICTS:
            mine, theirs, target = getattr(self, name), getattr(other, name), getattr(out, name)
            for key in set(mine) | set(theirs):
                target[key] = mine.get(key, 0) + sign * theirs.get(key, 0)
        return out

    def copy(self) -> "Tally":
        return self._combine(Tally(), 1)

    def plus(self, other: "Tally") -> "Tally":
        return self._combine(other, 1)

    def minus(self, before: "Tally") -> "Tally":
        return self._combine(before, -1)


def _writes(sql: str) -> bool:
    upper = sql.upper()
    return any(f"{verb} " in upper for verb in ("INSERT", "UPDATE ", "DELETE"))


_BATCH_SEPARATOR = re.compile(
    r";\n(?=(?:INSERT|UPDATE|DELETE|SELECT|WITH|PREPARE|EXECUTE|DEALLOCATE) )"
)


def _statements(
    sql: str, count: int, many: bool, results: list[int], rowcount: int
) -> list[tuple[str, int]]:
    """Each statement the execute ran, with the rows it affected.

    psycopg keeps one result per statement of a multi-statement execute
    (`results`: each one's row count, read when the execute returned); the
    DB-API `rowcount` is only the current (first unread or last) one's.
    """
    rows = max(rowcount, 0)
    if many:
        count = max(count, 1)
        return [(sql, rows // count)] * count
    # `execute_batch` binds values into the text: split only where a statement starts.
    parts = [p for p in _BATCH_SEPARATOR.split(sql) if p.strip()] or [sql]
    if len(results) == len(parts):
        return list(zip(parts, results, strict=True))
    return [(part, rows if i == len(parts) - 1 else 0) for i, part in enumerate(parts)]


def server_counters(database: str) -> dict[str, int]:
    """What the server itself counted for a database (all its backends), for deltas.

    Backends report their statistics when a transaction ends, at most about
    once a second while busy, and when they exit: close the clients' connections
    (and wait a moment) before reading a delta.
    """
    import os

    import psycopg

    from .environment import with_database

    with psycopg.connect(
        with_database(os.environ["DATABASE_URL"], database), autocommit=True
    ) as conn:
        # One statement, so this read is one transaction of the server's count.
        row = conn.execute(
            "SELECT d.xact_commit, d.xact_rollback, d.tup_inserted, d.tup_updated, d.tup_deleted, "
            "(SELECT coalesce(sum(n_tup_ins), 0) FROM pg_stat_user_tables), "
            "(SELECT coalesce(sum(n_tup_upd), 0) FROM pg_stat_user_tables), "
            "(SELECT coalesce(sum(n_tup_del), 0) FROM pg_stat_user_tables) "
            "FROM pg_stat_database d WHERE d.datname = current_database()"
        ).fetchone()
    assert row is not None
    names = ["xact_commit", "xact_rollback", "tup_inserted", "tup_updated", "tup_deleted"]
    names += ["tables_inserted", "tables_updated", "tables_deleted"]
    out = dict(zip(names, (int(v) for v in row), strict=True))
    # This read is a transaction too: a delta includes the `before` read's
    # (subtracted by `server_delta`).
    return out


def server_delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    delta = {k: after[k] - before.get(k, 0) for k in after}
    delta["xact_commit"] -= 1  # the reading connection's own read of `before`
    delta["rows_written"] = (
        delta["tables_inserted"] + delta["tables_updated"] + delta["tables_deleted"]
    )
    return delta


def _behind_execute(part: str) -> str:
    """A prepared step batch's `EXECUTE name(values)` read as the statement it runs
    (its text from `record.rows`; the values are not needed to count it)."""
    words = part.lstrip().split(None, 1)
    if len(words) < 2 or words[0].upper() != "EXECUTE":
        return part
    from record.rows import prepared_text

    return prepared_text(words[1].split("(", 1)[0].strip()) or part


def _table(sql: str, verb: str) -> str:
    words = sql.split(None, 6)
    try:
        if verb == "INSERT":
            name = words[2]
        elif verb == "UPDATE":
            name = words[1]
        elif verb == "DELETE":
            name = words[2]
        else:
            return ""
    except IndexError:
        return ""
    return name.strip('"').split("(")[0].strip('"')


@dataclass
class _Execute:
    """One execute as the wrapper saw it, classified later by `_drain`."""

    bucket: str
    sql: str
    count: int
    many: bool
    results: list[int]
    rowcount: int
    elapsed: float
    in_atomic: bool


class SqlCounter:
    """Tallies per thread name class: 'engine' (the thread that runs steps), 'heartbeat', 'other'."""

    def __init__(self, engine_thread: threading.Thread | None = None) -> None:
        self.engine_ident = (engine_thread or threading.current_thread()).ident
        self.lock = threading.Lock()
        self.tallies: dict[str, Tally] = defaultdict(Tally)
        # deque.append and popleft are atomic: executes on any thread append
        # without the lock.
        self._pending: deque[_Execute] = deque()
        self._installed = False
        self.active = False
        self._original_commit: Callable[..., Any] | None = None
        self._original_rollback: Callable[..., Any] | None = None

    def _bucket(self) -> str:
        thread = threading.current_thread()
        if thread.ident == self.engine_ident:
            return "engine"
        if thread.name == "lease-heartbeat":
            return "heartbeat"
        return "other"

    def __call__(
        self,
        execute: Callable[..., Any],
        sql: str,
        params: Any,
        many: bool,
        context: dict[str, Any],
    ) -> Any:
        if not self.active:
            return execute(sql, params, many, context)
        started = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            elapsed = time.perf_counter() - started
            cursor = context.get("cursor")
            raw = getattr(cursor, "cursor", cursor)
            conn = context.get("connection")
            # Only what the cursor will not keep is read here; splitting and
            # classifying the text waits for `snapshot`, outside the caller's
            # timed window (a step's batch is ~7 KB of text).
            self._pending.append(
                _Execute(
                    self._bucket(),
                    sql,
                    len(params) if many and isinstance(params, list | tuple) else 1,
                    many,
                    [max(r.command_tuples or 0, 0) for r in getattr(raw, "_results", None) or []],
                    getattr(cursor, "rowcount", -1) or 0,
                    elapsed,
                    bool(getattr(conn, "in_atomic_block", False)),
                )
            )

    def _drain(self) -> None:
        """Fold the executes recorded since the last call into the tallies (under the lock)."""
        while self._pending:
            done = self._pending.popleft()
            parts = _statements(done.sql, done.count, done.many, done.results, done.rowcount)
            tally = self.tallies[done.bucket]
            tally.round_trips += 1
            tally.db_seconds += done.elapsed
            wrote = False
            for sent, rows in parts:
                part = _behind_execute(sent)
                verb = part.lstrip().split(None, 1)[0].upper() if part.strip() else "?"
                tally.statements += 1
                tally.by_verb[verb] += 1
                if verb in ("PREPARE", "DEALLOCATE"):
                    tally.prepares += 1
                elif verb in WRITE_VERBS or (verb == "WITH" and _writes(part)):
                    wrote = True
                    tally.writes += 1
                    tally.rows_written += rows
                    table = _table(part, verb)
                    tally.rows_by_table[table] += rows
                    tally.seconds_by_table[table] += done.elapsed / len(parts)
                elif verb in ("SAVEPOINT", "RELEASE", "ROLLBACK"):
                    tally.savepoints += 1
                else:
                    tally.reads += 1
            if wrote and not done.in_atomic:
                tally.autocommit_writes += 1

    # ------------------------------------------------------------------ install
    def _on_connection(self, sender: Any, connection: Any, **kwargs: Any) -> None:
        if self not in connection.execute_wrappers:
            connection.execute_wrappers.append(self)

    def install(self) -> None:
        from django.db import connections
        from django.db.backends.postgresql.base import DatabaseWrapper
        from django.db.backends.signals import connection_created

        counter = self
        original_commit = DatabaseWrapper.commit
        original_rollback = DatabaseWrapper.rollback

        def commit(wrapper: Any) -> Any:
            if not counter.active:
                return original_commit(wrapper)
            with counter.lock:
                counter.tallies[counter._bucket()].explicit_commits += 1
            return original_commit(wrapper)

        def rollback(wrapper: Any) -> Any:
            if not counter.active:
                return original_rollback(wrapper)
            with counter.lock:
                counter.tallies[counter._bucket()].rollbacks += 1
            return original_rollback(wrapper)

        self._original_commit, self._original_rollback = original_commit, original_rollback
        DatabaseWrapper.commit = commit  # type: ignore[method-assign]
        DatabaseWrapper.rollback = rollback  # type: ignore[method-assign]
        connection_created.connect(
            self._on_connection, weak=False, dispatch_uid=f"bench-sql-{id(self)}"
        )
        for conn in connections.all(initialized_only=True):
            self._on_connection(None, conn)
        self._installed = True
        self.active = True

    def uninstall(self) -> None:
        from django.db import connections
        from django.db.backends.postgresql.base import DatabaseWrapper
        from django.db.backends.signals import connection_created

        self.active = False
        if not self._installed:
            return
        DatabaseWrapper.commit = self._original_commit  # type: ignore[method-assign]
        DatabaseWrapper.rollback = self._original_rollback  # type: ignore[method-assign]
        connection_created.disconnect(dispatch_uid=f"bench-sql-{id(self)}")
        for conn in connections.all(initialized_only=True):
            if self in conn.execute_wrappers:
                conn.execute_wrappers.remove(self)
        self._installed = False

    def snapshot(self, bucket: str = "engine") -> Tally:
        with self.lock:
            self._drain()
            return self.tallies[bucket].copy()
