"""Shared by the worker benchmarks: post many turns at once, watch them, read back their steps.

Steps and their times come from the `Transition` rows the worker wrote: every
`step_commit` of a run writes one (the tool results' commit two, tool results
and the move back to the model, with the same `at`: counted as one step),
stamped (`at`) inside the step's transaction, so the gap between a session's consecutive transitions is the
latency of a step as the session saw it (queue wait and model time included).
Runs in flight are sampled every 50 ms from the session rows: a session whose
lease a worker holds (`lease_owner` set; a turn started by `message_post` has
none until a worker takes it).
"""

import contextlib
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .procs import STOP
from .stats import percentile

RUNNABLE = ("processing", "tool_wait", "tool_loop")


def process_cpu_s(pid: int) -> float:
    """utime + stime of a process (all its threads), in seconds."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of a process and its children (a web master and its workers;
    a PostgreSQL postmaster and its backends)."""
    total = 0.0
    for child in [pid, *_children(pid)]:
        with contextlib.suppress(OSError):
            total += process_cpu_s(child)
    return total


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        tasks = Path(f"/proc/{pid}/task").iterdir()
        for task in tasks:
            text = (task / "children").read_text().split()
            for child in text:
                out.append(int(child))
                out.extend(_children(int(child)))
    except OSError:
        pass
    return out


def database_server_pid() -> int | None:
    """The postmaster of the database Django's connection reaches (the parent of its
    backend), when the server runs on this machine and /proc shows it; else None."""
    from django.db import connection

    with connection.cursor():
        backend = connection.connection.info.backend_pid
    try:
        with open(f"/proc/{backend}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return None


class MachineLoad:
    """Busy (and stolen) share of all CPUs between start() and stop(), from /proc/stat."""

    def __init__(self) -> None:
        self._start: list[int] | None = None
        self.loadavg_start = os.getloadavg()[0]

    @staticmethod
    def _read() -> list[int]:
        with open("/proc/stat") as fh:
            return [int(v) for v in fh.readline().split()[1:9]]

    def start(self) -> None:
        self._start = self._read()

    def stop(self) -> dict[str, Any]:
        now = self._read()
        busy = steal = None
        if self._start:
            delta = [b - a for a, b in zip(self._start, now, strict=True)]
            total = sum(delta)
            idle = delta[3] + delta[4]
            if total:
                busy = round(100.0 * (total - idle) / total, 1)
                steal = round(100.0 * delta[7] / total, 1) if len(delta) > 7 else None
        return {
            "machine_cpu_busy_pct": busy,
            "machine_cpu_steal_pct": steal,
            "loadavg_1m_start": round(self.loadavg_start, 2),
            "loadavg_1m_end": round(os.getloadavg()[0], 2),
        }


# pg_stat_activity's wait events that are the WAL: a commit's flush, or a backend
# waiting for another's.
WAL_WAITS = frozenset({"LWLock/WALWrite", "LWLock/WALInsert", "IO/WalSync", "IO/WalWrite"})


class DatabaseWaits:
    """What the active backends of one database do, sampled from `pg_stat_activity`
    every `interval` seconds between start() and stop() on a connection of its own.

    A backend with no wait event is on a CPU or waiting for one (`running`); else
    `type/event`: `Lock/transactionid` is a row lock held by another transaction,
    `IO/WalSync` a commit's flush (PostgreSQL's wait event names).
    """

    def __init__(self, url: str, interval: float = 0.05) -> None:
        self._url = url
        self._interval = interval
        self._counts: dict[str, int] = {}
        self._samples = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: str | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._sample, name="db-waits", daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        import psycopg

        try:
            with psycopg.connect(self._url, autocommit=True) as conn:
                while not self._stop.is_set():
                    rows = conn.execute(
                        "SELECT wait_event_type, wait_event FROM pg_stat_activity "
                        "WHERE datname = current_database() AND state = 'active' "
                        "AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
                    ).fetchall()
                    self._samples += 1
                    for kind, event in rows:
                        key = "running" if kind is None else f"{kind}/{event}"
                        self._counts[key] = self._counts.get(key, 0) + 1
                    self._stop.wait(self._interval)
        except Exception as error:  # noqa: BLE001 - the figures say it is missing
            self.error = f"{type(error).__name__}: {error}"

    def stop(self) -> dict[str, Any]:
        """Samples taken, active backends per sample, and each state's share (%) of them."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        seen = sum(self._counts.values())

        def share(keys: Any) -> float:
            return (
                round(100.0 * sum(self._counts.get(k, 0) for k in keys) / seen, 1) if seen else 0.0
            )

        return {
            "samples": self._samples,
            "active_backends_mean": round(seen / self._samples, 2) if self._samples else 0.0,
            "running_pct": share(["running"]),
            "row_lock_pct": share([k for k in self._counts if k.startswith("Lock/")]),
            "wal_pct": share(WAL_WAITS),
            "shares_pct": {
                key: share([key]) for key in sorted(self._counts, key=lambda k: -self._counts[k])
            },
            "error": self.error,
        }


@dataclass
class Sample:
    t: float
    leased: int
    runnable: int
    finished: int


@dataclass
class Watcher:
    """Polls the sessions' rows on a connection of its own until all are finished."""

    ids: list[str]
    interval: float = 0.05
    samples: list[Sample] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None

    def run(self, timeout: float) -> None:
        import psycopg

        deadline = time.monotonic() + timeout
        try:
            with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
                while time.monotonic() < deadline and not STOP.is_set():
                    row = conn.execute(
                        "SELECT count(*) FILTER (WHERE lease_owner IS NOT NULL),"
                        "       count(*) FILTER (WHERE state = ANY(%s)),"
                        "       count(*) FILTER (WHERE state IN ('finished', 'error', 'cancelled')"
                        "                          AND queued_count = 0)"
                        "  FROM agent_sessions_session WHERE id = ANY(%s::uuid[])",
                        [list(RUNNABLE), self.ids],
                    ).fetchone()
                    assert row is not None
                    self.samples.append(Sample(time.time(), row[0], row[1], row[2]))
                    if row[2] == len(self.ids):
                        self.done.set()
                        return
                    time.sleep(self.interval)
        except BaseException as exc:  # noqa: BLE001 - reported by wait()
            self.error = exc
        finally:
            self.done.set()

    def start(self, timeout: float) -> threading.Thread:
        thread = threading.Thread(
            target=self.run, args=(timeout,), name="bench-watcher", daemon=True
        )
        thread.start()
        return thread

    def wait(self) -> bool:
        """True when every turn ended; raises if one ended in `error` or `cancelled`."""
        self.done.wait()
        if STOP.is_set():
            raise KeyboardInterrupt("stopping")
        if self.error:
            raise self.error
        if not (self.samples and self.samples[-1].finished == len(self.ids)):
            return False
        import psycopg

        with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
            failed = conn.execute(
                "SELECT state, last_error FROM agent_sessions_session"
                " WHERE id = ANY(%s::uuid[]) AND state <> 'finished'",
                [self.ids],
            ).fetchall()
        if failed:
            raise RuntimeError(
                f"{len(failed)} of {len(self.ids)} turns did not finish cleanly: {failed[0]}"
            )
        return True


def post_all(sessions: list[Any], content: str, threads: int) -> list[tuple[float, float]]:
    """message_post into every session from `threads` threads at once; (start, end) wall times per post."""
    from django.db import connection

    from sessions.services import message_post

    def post(session: Any) -> tuple[float, float]:
        started = time.time()
        try:
            message_post(session=session, content=content)
        finally:
            connection.close()
        return started, time.time()

    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="bench-post") as pool:
        return list(pool.map(post, sessions))


@dataclass
class StepRow:
    session: str
    version: int
    trigger: str
    from_state: str
    to_state: str
    at: float


def transitions(ids: list[str]) -> list[StepRow]:
    import psycopg

    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        # One row per commit: the moves of one step share its transaction's `at`.
        rows = conn.execute(
            "SELECT * FROM (SELECT DISTINCT ON (session_id, at) session_id::text, version, trigger, "
            "       from_state, to_state, extract(epoch FROM at)::float8 AS at_s "
            "  FROM agent_sessions_transition WHERE session_id = ANY(%s::uuid[]) "
            " ORDER BY session_id, at, version) AS steps ORDER BY session_id, version",
            [ids],
        ).fetchall()
    return [StepRow(*row) for row in rows]


def step_latencies(rows: list[StepRow]) -> list[tuple[StepRow, float]]:
    """(worker step, seconds since the session's previous transition) for every worker step."""
    out: list[tuple[StepRow, float]] = []
    previous: dict[str, float] = {}
    for row in rows:
        if row.session in previous and row.trigger != "user_message":
            out.append((row, row.at - previous[row.session]))
        previous[row.session] = row.at
    return out


def busiest_window(times: list[float], window: float = 1.0) -> float:
    """Most events in any `window` seconds, per second."""
    ordered = sorted(times)
    best = 0
    low = 0
    for high, t in enumerate(ordered):
        while t - ordered[low] > window:
            low += 1
        best = max(best, high - low + 1)
    return best / window


def turn_latencies(rows: list[StepRow], posted: dict[str, float]) -> list[float]:
    """Seconds from the start of each session's post to its turn's end."""
    ends: dict[str, float] = {}
    for row in rows:
        if row.to_state in ("finished", "error", "cancelled"):
            ends[row.session] = row.at
    return [ends[s] - posted[s] for s in posted if s in ends]


def p(values: list[float], q: float, scale: float = 1.0) -> float:
    return percentile(values, q) * scale


def consumers(nodes: list[str], *, on: bool) -> None:
    """Stop or start the workers' consuming of the bench queue (Celery remote control)."""
    from celery import current_app

    queue = os.environ["CELERY_QUEUE"]
    control = current_app.control
    command = control.add_consumer if on else control.cancel_consumer
    replies = command(queue, destination=nodes, reply=True, timeout=5)
    if len(replies or []) < len(nodes):
        raise RuntimeError(
            f"{'add' if on else 'cancel'}_consumer: only {replies!r} answered for {nodes}"
        )


@dataclass
class Drive:
    posts: list[tuple[float, float]]
    started: float  # wall time the measured window starts (first post, or the release)
    samples: list[Sample]
    cpu_s: float
    machine: dict[str, Any]
    pyspy: str | None


def drive(
    procs: Any,
    names: list[str],
    nodes: list[str],
    targets: list[Any],
    content: str,
    *,
    post_threads: int,
    live: bool,
    timeout: float,
    label: str,
) -> Drive:
    """Post one turn into every session and wait until all have finished.

    live=False (the default of the benchmarks): the workers stop consuming the
    queue, the turns are posted (timed on their own), then the workers are let
    go at once: the window measures the workers, not how fast this one process
    can call message_post (from 16 threads under one GIL it took 4-15 s for
    200 posts on a busy 2-core machine, longer than a turn). live=True posts
    while the workers run, and the window starts at the first post.
    """
    from django.db import connection

    connection.close()
    ids = [str(s.pk) for s in targets]
    pids = [procs.procs[name].pid for name in names]
    watcher = Watcher(ids)
    if not live:
        consumers(nodes, on=False)
        posts = post_all(targets, content, threads=post_threads)
    load = MachineLoad()
    cpu_before = sum(process_cpu_s(pid) for pid in pids)
    stop_spy = procs.spy(pids[0], label)
    load.start()
    watcher.start(timeout=timeout)
    started = time.time()
    if live:
        posts = post_all(targets, content, threads=post_threads)
    else:
        consumers(nodes, on=True)
    finished = watcher.wait()
    cpu_s = sum(process_cpu_s(pid) for pid in pids) - cpu_before
    machine = load.stop()
    spy_file = stop_spy()
    if not finished:
        last = watcher.samples[-1] if watcher.samples else None
        raise RuntimeError(
            f"not all turns finished in {timeout:g} s (last sample {last}):\n{procs.log_tail(names[0])}"
        )
    return Drive(posts, started, watcher.samples, cpu_s, machine, spy_file)
