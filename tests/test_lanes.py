"""`make test`'s lane runner: its totals and its list of the slowest tests come from the
lanes' JUnit reports."""

from pathlib import Path

from tests.lanes import counts, slowest

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
