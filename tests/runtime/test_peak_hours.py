"""Peak-hour windows: which times are in, and what a wrong window is told."""

from datetime import datetime

import pytest

from runtime.peak_hours import is_peak, peak_hours_problems, time_zone, window_bounds


def _at(hour: int, minute: int = 0) -> datetime:
    return datetime(2026, 3, 2, hour, minute)


@pytest.mark.parametrize(
    ("windows", "at", "peak"),
    [
        (["09:00-12:00"], _at(9), True),
        (["09:00-12:00"], _at(11, 59), True),
        (["09:00-12:00"], _at(12), False),  # the end is not in
        (["09:00-12:00"], _at(8, 59), False),
        (["09:00-12:00", "14:00-18:00"], _at(15, 30), True),
        (["09:00-12:00", "14:00-18:00"], _at(13), False),
        (["22:00-02:00"], _at(23, 30), True),  # past midnight
        (["22:00-02:00"], _at(1, 59), True),
        (["22:00-02:00"], _at(2), False),
        (["18:00-24:00"], _at(23, 59), True),
        (["00:00-24:00"], _at(0), True),  # all day
        ([], _at(10), False),
        (["nonsense", "09:00-12:00"], _at(10), True),  # a stored wrong window counts as none
    ],
)
def test_a_time_is_peak_inside_a_window(windows: list[str], at: datetime, peak: bool) -> None:
    assert is_peak(windows, at) is peak


@pytest.mark.parametrize(
    "window",
    [
        "25:00-26:00",
        "09:60-10:00",
        "9:00-12:00",
        "09:00-12:00 ",
        "09:00–12:00",  # an en dash
        "12:00-12:00",  # empty
        "24:00-02:00",  # 24:00 ends a window only
        "٠٩:٠٠-١٢:٠٠",  # Arabic-Indic digits are digits to \d, not to us
        "09:00-12:00\n",
        "x" * 10_000,
        "",
    ],
)
def test_a_wrong_window_is_not_one(window: str) -> None:
    assert window_bounds(window) is None
    assert peak_hours_problems([window]) == [
        f"[0]: {window[:40]!r} is not a window HH:MM-HH:MM (00:00 to 24:00, start and end different)"
    ]


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("09:00-12:00", ": must be a list of windows such as '09:00-12:00'"),
        ({"from": "09:00"}, ": must be a list of windows such as '09:00-12:00'"),
        (["09:00-10:00"] * 25, ": at most 24 windows (there are 25)"),
        ([None], "[0]: 'None' is not a window"),
        (["09:00-10:00", 930], "[1]: '930' is not a window"),
    ],
)
def test_a_wrong_value_names_its_entry(value: object, problem: str) -> None:
    problems = peak_hours_problems(value)
    assert len(problems) == 1 and problems[0].startswith(problem), problems


def test_right_windows_have_no_problem() -> None:
    assert peak_hours_problems(["09:00-12:00", "22:00-02:00", "00:00-24:00"]) == []


@pytest.mark.parametrize("name", ["Mars/Olympus", "../../etc/passwd", "America", "", "UTC\x00"])
def test_a_time_zone_that_is_not_one(name: str) -> None:
    assert time_zone(name) is None
    assert time_zone("Asia/Shanghai") is not None
