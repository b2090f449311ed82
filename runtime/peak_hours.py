"""An agent's peak hours (runtime-mechanisms 2.3): windows such as "09:00-12:00" in the
agent's time zone. A window may run past midnight ("22:00-02:00") and end at "24:00"."""

import re
from collections.abc import Sequence
from datetime import datetime
from functools import lru_cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

_WINDOW = re.compile(r"([0-9]{2}):([0-9]{2})-([0-9]{2}):([0-9]{2})")
MAX_WINDOWS = 24


@lru_cache(maxsize=512)
def time_zone(name: str) -> ZoneInfo | None:
    """The IANA zone so named, or None."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):  # not a zone name (or a directory)
        return None


def _minutes(hours: str, minutes: str, *, end: bool) -> int | None:
    h, m = int(hours), int(minutes)
    if m > 59 or h > 24 or (h == 24 and (m or not end)):
        return None
    return h * 60 + m


def window_bounds(text: str) -> tuple[int, int] | None:
    """The window's start and end in minutes after midnight; None if it is not one."""
    found = _WINDOW.fullmatch(text) if isinstance(text, str) else None
    if found is None:
        return None
    start = _minutes(found[1], found[2], end=False)
    end = _minutes(found[3], found[4], end=True)
    if start is None or end is None or start == end:
        return None  # empty (all day is 00:00-24:00)
    return start, end


def peak_hours_problems(value: object) -> list[str]:
    """What is wrong with a `peak_hours` value, each problem after the entry it is about
    ("[1]: ..." or ": ..." for the whole list), to follow the field's name."""
    if not isinstance(value, list):
        return [": must be a list of windows such as '09:00-12:00'"]
    if len(value) > MAX_WINDOWS:
        return [f": at most {MAX_WINDOWS} windows (there are {len(value)})"]
    return [
        f"[{i}]: {str(entry)[:40]!r} is not a window HH:MM-HH:MM (00:00 to 24:00, "
        "start and end different)"
        for i, entry in enumerate(value)
        if not isinstance(entry, str) or window_bounds(entry) is None
    ]


def is_peak(windows: Sequence[str], local: datetime) -> bool:
    """Is `local` (already in the agent's time zone) inside one of the windows?
    A window that is not one (never stored: the admin and the config file refuse it)
    counts as none."""
    minute = local.hour * 60 + local.minute
    for text in windows:
        bounds = window_bounds(text)
        if bounds is None:
            continue
        start, end = bounds
        if start < end and start <= minute < end:
            return True
        if start > end and (minute >= start or minute < end):  # past midnight
            return True
    return False
