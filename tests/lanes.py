"""`make test`'s pytest: two lanes at once, each on its own pytest-xdist workers.

    python -m tests.lanes [pytest arguments]          # every lane (make test)
    python -m tests.lanes --lane fast [arguments]     # the in-process lane only (make test-fast)

The in-process lane (`-m "not e2e"`) is CPU-bound; the end-to-end lane (`-m e2e`) mostly
waits on its processes (daphne, Celery worker and beat, browsers). Run side by side they
share the two cores instead of taking turns. They are separate pytest runs, not one run's
workers: an e2e worker's live stack takes every task on its worker's queue, so an
in-process test must never run in a process whose stack is up (tests/conftest.py), and
separate runs keep that true whatever the scheduler does. Each run and each of its
workers has its own test database, Celery queue and Redis prefixes (tests/pytest_env.py).

A third lane starts when the first of those two ends: the end-to-end tests marked
`fast_paths` again, with `FAST_PATHS=off` (runtime/fastpaths/), so every fallback to a
library's public API is proven on the real stack, not only the fast paths.

The in-process lane streams to the terminal; the e2e and fallback lanes write to logs
that are printed whole once it ends, then followed live. The last line adds the two lanes up
('N passed, N failed, N skipped'); the exit status is the worse of the two.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOGS = ROOT / ".data" / "test-logs"
# pytest's "no tests ran": a lane that a -k or a path selected nothing from is not a failure.
NO_TESTS = 5


@dataclass
class Lane:
    name: str
    marker: str
    workers: str
    dist: str

    env: dict[str, str] | None = None  # added to the environment for this lane

    def start(
        self, extra: list[str], junit: Path, log: Path | None = None
    ) -> subprocess.Popen[bytes]:
        """Start the lane's pytest: to the terminal, or (with `log`) to that file."""
        env = {**os.environ, **(self.env or {})}
        if log is None:
            return subprocess.Popen(self.argv(extra, junit), cwd=ROOT, env=env)
        with log.open("wb") as handle:
            return subprocess.Popen(
                self.argv(extra, junit), cwd=ROOT, env=env, stdout=handle, stderr=subprocess.STDOUT
            )

    def argv(self, extra: list[str], junit: Path) -> list[str]:
        return [
            sys.executable,
            "-m",
            "pytest",
            "-m",
            self.marker,
            "-n",
            self.workers,
            "--dist",
            self.dist,
            "--durations=25",
            f"--junitxml={junit}",
            *extra,
        ]


# loadscope keeps a module on one worker, so a module's own stack (the fault and
# revocation tests) boots once; the largest modules are handed out first.
# The in-process lane is the long pole: with 2 workers it was at a third of its tests when
# the e2e lane (3 workers, mostly waiting on its processes) was at nine tenths, and after
# the e2e lane ends only the one fallback worker runs beside it. A third worker takes the
# CPU the e2e lane leaves while it waits (as in `make test-fast`: 127 s instead of 143 s).
FAST = Lane("in-process", "not e2e", os.environ.get("PYTEST_WORKERS", "3"), "load")
E2E = Lane("e2e", "e2e", os.environ.get("E2E_WORKERS", "3"), "loadscope")
FALLBACKS = Lane(
    "fast-paths-off", "e2e and fast_paths", "1", "loadscope", env={"FAST_PATHS": "off"}
)


def counts(junit: Path) -> dict[str, int]:
    """passed / failed / skipped of one lane's JUnit report (errors count as failed)."""
    totals = {"passed": 0, "failed": 0, "skipped": 0}
    if not junit.exists():
        return totals
    for suite in ET.parse(junit).getroot().iter("testsuite"):
        tests, failures, errors, skipped = (
            int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")
        )
        totals["failed"] += failures + errors
        totals["skipped"] += skipped
        totals["passed"] += tests - failures - errors - skipped
    return totals


def slowest(junits: dict[str, Path], count: int = 25) -> list[str]:
    """The `count` slowest tests of every lane (JUnit's time: setup, call and teardown)."""
    timed = []
    for lane, junit in junits.items():
        if junit.exists():
            for case in ET.parse(junit).getroot().iter("testcase"):
                name = f"{case.get('classname', '')}::{case.get('name', '')}"
                timed.append((float(case.get("time", 0)), lane, name))
    return [
        f"{s:8.2f} s  {lane:<14} {name}" for s, lane, name in sorted(timed, reverse=True)[:count]
    ]


@dataclass
class Ended:
    """When a lane's pytest ended (seconds after the start) and the CPU it and every process
    it reaped used (its xdist workers, their live stacks and browsers; not the embedded
    PostgreSQL and Valkey, which are not its children)."""

    at: float
    cpu_s: float


def watch(
    process: subprocess.Popen[bytes], started: float, ends: dict[str, Ended], name: str
) -> None:
    """Record in `ends[name]` when `process` ends, from a thread of its own.

    The lanes are waited on one after the other to print their logs in order, so the time a
    wait returns is not when that lane ended; on a shared machine the CPU seconds are the
    figure that compares two runs."""

    def wait() -> None:
        _pid, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
        ends[name] = Ended(time.monotonic() - started, usage.ru_utime + usage.ru_stime)

    threading.Thread(target=wait, daemon=True).start()


def ends_line(ends: dict[str, Ended]) -> str:
    return ", ".join(
        f"{name} ended at {end.at:.0f} s ({end.cpu_s:.0f} CPU-s)"
        for name, end in sorted(ends.items(), key=lambda item: item[1].at)
    )


def follow(path: Path, stop: threading.Event) -> None:
    """Print what is written to `path` until `stop` is set and the file is read to its end."""
    with path.open("rb") as handle:
        while True:
            chunk = handle.read(65536)
            if chunk:
                sys.stdout.buffer.write(chunk)
                sys.stdout.flush()
            elif stop.is_set():
                return
            else:
                time.sleep(0.2)


def warm_bytecode(extra: list[str]) -> None:
    """Collect the whole suite once (in two processes, a half each) before the lanes' workers start.

    Every pytest worker imports every test module it may run; without a cached copy it parses
    and assertion-rewrites each one (14.6 CPU-s a worker for the in-process lane's modules,
    5.9 s from pytest's cache). The lanes' six workers start at once, so on a fresh clone each
    would rewrite everything itself and none would find the others' cache: one collection
    first writes it (and the project's own bytecode, which the live stacks' processes read).
    Skipped where nothing would be written (PYTHONDONTWRITEBYTECODE), where it is written
    already, and for a run given pytest arguments (paths or a -k: it would collect more than
    they run)."""
    cached = any((ROOT / "tests" / "__pycache__").glob("conftest.*-pytest-*.pyc"))
    if sys.dont_write_bytecode or cached or extra:
        return
    started = time.monotonic()
    # Two halves of the tree side by side, one a core: each module is still compiled once.
    paths = sorted(
        str(p.relative_to(ROOT))
        for p in (ROOT / "tests").iterdir()
        if (p.is_dir() and p.name != "__pycache__")
        or (p.name.startswith("test_") and p.suffix == ".py")
    )
    halves = [
        subprocess.Popen(
            [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
            + paths[half::2],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
        )
        for half in (0, 1)
    ]
    for process in halves:
        process.wait()
    print(f"lanes: bytecode written by one collection in {time.monotonic() - started:.0f} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lane", choices=("all", "fast"), default="all")
    options, extra = parser.parse_known_args()
    LOGS.mkdir(parents=True, exist_ok=True)
    stamp = os.getpid()
    fast_junit = LOGS / f"lane-fast-{stamp}.xml"
    warm_bytecode(extra)
    started = time.monotonic()

    if options.lane == "fast":
        # Alone on the machine, a third worker fills the time the others wait (sleeps,
        # subprocesses, the database): ~127 s instead of ~143 s on 2 cores.
        alone = Lane(FAST.name, FAST.marker, os.environ.get("PYTEST_WORKERS", "3"), FAST.dist)
        ends: dict[str, Ended] = {}
        process = alone.start(extra, fast_junit)
        watch(process, started, ends, "in-process")
        while "in-process" not in ends:
            time.sleep(0.5)
        print(f"\nlanes: {ends_line(ends)}")
        code = process.returncode
        return 0 if code == NO_TESTS else code

    e2e_junit = LOGS / f"lane-e2e-{stamp}.xml"
    fallback_junit = LOGS / f"lane-fallbacks-{stamp}.xml"
    e2e_log = LOGS / f"lane-e2e-{stamp}.log"
    fallback_log = LOGS / f"lane-fallbacks-{stamp}.log"
    e2e = E2E.start(extra, e2e_junit, e2e_log)
    print(f"lanes: the e2e lane runs beside this one; its output follows ({e2e_log})", flush=True)
    fast = FAST.start(extra, fast_junit)
    fallback: subprocess.Popen[bytes] | None = None
    ends: dict[str, Ended] = {}
    watch(e2e, started, ends, "e2e")
    watch(fast, started, ends, "in-process")
    try:
        # The fallback lane takes the place of whichever lane ends first.
        while "in-process" not in ends and "e2e" not in ends:
            time.sleep(0.5)
        fallback = FALLBACKS.start(extra, fallback_junit, fallback_log)
        fallback_started = time.monotonic() - started
        watch(fallback, started, ends, "fast-paths-off")
        while "in-process" not in ends:
            time.sleep(0.5)
        fast_code = fast.returncode
        print(f"\nlanes: in-process lane done in {ends['in-process'].at:.0f} s", flush=True)
        for name, log in (("e2e", e2e_log), ("fast-paths-off", fallback_log)):
            print(f"lanes: the {name} lane ({log}):", flush=True)
            stop = threading.Event()
            reader = threading.Thread(target=follow, args=(log, stop), daemon=True)
            reader.start()
            while name not in ends:
                time.sleep(0.5)
            stop.set()
            reader.join()
            print(f"lanes: {name} lane ended at {ends[name].at:.0f} s", flush=True)
        e2e_code, fallback_code = e2e.returncode, fallback.returncode
    finally:
        for process in (fast, e2e, fallback):
            if process is not None and process.poll() is None:
                process.terminate()
                process.wait(30)

    codes = [c for c in (fast_code, fallback_code, e2e_code) if c != NO_TESTS]
    lanes = [counts(junit) for junit in (fast_junit, fallback_junit, e2e_junit)]
    totals = {k: sum(lane[k] for lane in lanes) for k in lanes[0]}
    junits = {"in-process": fast_junit, "e2e": e2e_junit, "fast-paths-off": fallback_junit}
    print("\nlanes: the 25 slowest tests of all lanes (setup + call + teardown):")
    print("\n".join(slowest(junits)))
    print(f"\nlanes: all done in {time.monotonic() - started:.0f} s ({ends_line(ends)};")
    print(f"lanes: fast-paths-off started at {fallback_started:.0f} s)")
    print(
        f"total: {totals['passed']} passed, {totals['failed']} failed, {totals['skipped']} skipped"
    )
    if not codes:
        return NO_TESTS
    return max(codes)


if __name__ == "__main__":
    sys.exit(main())
