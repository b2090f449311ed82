"""Logging wiring: Celery's per-task chatter about the periodic sweeper goes to DEBUG; a
refusal (4xx) is logged without the traceback of the exception that made it."""

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


class RefusalsWithoutTraceback(logging.Filter):
    """Keep Django's line about a 4xx, drop the traceback Django attaches to it.

    Django logs every PermissionDenied, SuspiciousOperation and Http404 with `exc_info`: a
    denied admin POST wrote ~20 frames to the log, and formatting them (Python 3.11 parses
    each source line for its carets) cost more than rendering the refusal page. A 4xx is
    the platform working as meant; a 5xx keeps its traceback.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        status = getattr(record, "status_code", None)
        if isinstance(status, int) and status < 500:
            record.exc_info = None
            record.exc_text = None
        return True
