"""`make test`'s lane runner: its totals and its list of the slowest tests come from the
lanes' JUnit reports."""

import subprocess
import sys
import time
from pathlib import Path

from tests.lanes import Ended, counts, ends_line, slowest, watch

REPORT = """<testsuites><testsuite tests="3" failures="1" errors="0" skipped="1">
<testcase classname="tests.a" name="test_slow" time="12.5"/>
<testcase classname="tests.a" name="test_quick" time="0.1"/>
<testcase classname="tests.b" name="test_mid" time="3"/>
</testsuite></testsuites>"""


def test_the_slowest_tests_of_every_lane_come_first(tmp_path: Path) -> None:
    (tmp_path / "fast.xml").write_text(REPORT)
    (tmp_path / "e2e.xml").write_text(REPORT.replace("12.5", "20").replace("test_", "test_e2e_"))
    junits = {"in-process": tmp_path / "fast.xml", "e2e": tmp_path / "e2e.xml"}
    junits["missing"] = tmp_path / "never-written.xml"  # a lane that did not run

    top = slowest(junits, count=2)

    assert [line.split()[-1] for line in top] == ["tests.a::test_e2e_slow", "tests.a::test_slow"]
    assert top[0].split()[:3] == ["20.00", "s", "e2e"]


def test_a_lanes_counts_add_errors_to_failures(tmp_path: Path) -> None:
    (tmp_path / "fast.xml").write_text(REPORT)
    assert counts(tmp_path / "fast.xml") == {"passed": 1, "failed": 1, "skipped": 1}
    assert counts(tmp_path / "absent.xml") == {"passed": 0, "failed": 0, "skipped": 0}


def test_a_lane_ends_when_its_process_ends_with_the_cpu_it_used() -> None:
    """The lanes are waited on in printing order; the end recorded is the process's own."""
    started = time.monotonic()
    ends: dict[str, Ended] = {}
    # The slow lane ends when its input is closed, which happens once the busy one has ended.
    slow = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    busy = subprocess.Popen([sys.executable, "-c", "sum(range(20_000_000)); raise SystemExit(3)"])
    watch(slow, started, ends, "slow")
    watch(busy, started, ends, "busy")
    deadline = time.monotonic() + 60
    for name in ("busy", "slow"):
        while name not in ends:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        if name == "busy":
            assert slow.stdin is not None
            slow.stdin.close()

    assert ends["busy"].at < ends["slow"].at
    assert ends["busy"].cpu_s > ends["slow"].cpu_s
    assert (busy.returncode, slow.returncode) == (3, 0)
    assert ends_line(ends).startswith("busy ended at")
