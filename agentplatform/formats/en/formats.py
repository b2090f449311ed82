"""One date format across the admin: ISO dates and 24-hour times to the second (Django's
"en" default reads "Dec. 3, 2026, 10:41 a.m." on some pages beside "2026-12-03 10:41:07"
on others)."""

DATE_FORMAT = "Y-m-d"
TIME_FORMAT = "H:i:s"
DATETIME_FORMAT = "Y-m-d H:i:s"
SHORT_DATE_FORMAT = "Y-m-d"
SHORT_DATETIME_FORMAT = "Y-m-d H:i:s"
MONTH_DAY_FORMAT = "F j"
YEAR_MONTH_FORMAT = "F Y"
FIRST_DAY_OF_WEEK = 1
