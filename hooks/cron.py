"""Cron expressions in a time zone, by croniter (a maintained parser, not a home-made one).

Five fields only (minute hour day-of-month month day-of-week): croniter also takes a
seconds field and more, which a schedule does not promise. Times are worked out in the
schedule's zone, so "0 2 * * *" stays 02:00 local across daylight saving changes.
"""

from datetime import datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter
from croniter.croniter import CroniterError


def cron_problem(expression: str) -> str | None:
    """What is wrong with this expression, or None."""
    if len(expression.split()) != 5:
        return f"'{expression}' is not five fields (minute hour day month weekday)"
    if not croniter.is_valid(expression):
        return f"'{expression}' is not a valid cron expression"
    return None


def zone_problem(zone: str) -> str | None:
    """What is wrong with this time zone's name, or None."""
    try:
        ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError):
        return f"unknown time zone '{zone}' (an IANA name such as Europe/Berlin or UTC)"
    return None


def fire_times(expression: str, zone: str, after: datetime, count: int = 1) -> list[datetime]:
    """The next `count` times strictly after `after`, as aware datetimes in `zone`."""
    try:
        cursor = croniter(expression, after.astimezone(ZoneInfo(zone)))
        return [cursor.get_next(datetime) for _ in range(count)]
    except (CroniterError, ValueError, KeyError):
        return []
