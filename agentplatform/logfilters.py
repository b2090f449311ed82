"""Logging wiring: Celery's per-task chatter about the periodic sweeper goes to DEBUG."""

import logging

# Tasks beat sends every SWEEPER_INTERVAL_S; one INFO line each from beat and
# two from the worker would drown everything else (the sweeper itself logs at
# INFO when it actually requeues or wakes something).
QUIET_TASKS = ("sessions.tasks.sweep_sessions",)


class QuietPeriodicTasks(logging.Filter):
    """Demote INFO records about the quiet tasks to DEBUG; drop them unless DEBUG is on."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.INFO:
            return True
        try:
            message = record.getMessage()
        except (TypeError, ValueError):
            return True
        if not any(name in message for name in QUIET_TASKS):
            return True
        record.levelno = logging.DEBUG
        record.levelname = logging.getLevelName(logging.DEBUG)
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
