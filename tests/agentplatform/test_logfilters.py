"""Celery's lines about each sweep are DEBUG; everything else passes untouched."""

import logging

import pytest
from django.core.exceptions import PermissionDenied
from django.http import HttpResponse
from django.test import RequestFactory
from django.utils.log import log_response

from agentplatform.logfilters import QuietPeriodicTasks


def _record(name: str, msg: str, args: object, level: int = logging.INFO) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, msg, args, None)


def test_beat_sending_the_sweeper_is_dropped_at_info():
    logger = logging.getLogger("celery.beat")
    logger.setLevel(logging.INFO)
    record = _record(
        "celery.beat",
        "Scheduler: Sending due task %s (%s)",
        ("sweep-sessions", "sessions.tasks.sweep_sessions"),
    )
    assert QuietPeriodicTasks().filter(record) is False
    assert record.levelno == logging.DEBUG and record.levelname == "DEBUG"


def test_worker_trace_of_the_sweeper_is_kept_as_debug_when_debug_is_on():
    logger = logging.getLogger("celery.app.trace")
    logger.setLevel(logging.DEBUG)
    try:
        record = _record(
            "celery.app.trace",
            "Task %(name)s[%(id)s] succeeded in %(runtime)ss: %(return_value)s",
            {
                "name": "sessions.tasks.sweep_sessions",
                "id": "x",
                "runtime": 0.01,
                "return_value": 0,
            },
        )
        assert QuietPeriodicTasks().filter(record) is True
        assert record.levelname == "DEBUG"
    finally:
        logger.setLevel(logging.NOTSET)


def test_other_tasks_and_warnings_pass_unchanged():
    run = _record(
        "celery.worker.strategy",
        "Task %(name)s[%(id)s] received",
        {"name": "sessions.tasks.run_session", "id": "y"},
    )
    assert QuietPeriodicTasks().filter(run) is True and run.levelno == logging.INFO
    failed = _record(
        "celery.app.trace",
        "Task %s raised",
        ("sessions.tasks.sweep_sessions",),
        level=logging.ERROR,
    )
    assert QuietPeriodicTasks().filter(failed) is True and failed.levelno == logging.ERROR


def test_the_filter_is_installed_on_celerys_loggers(settings):
    loggers = settings.LOGGING["loggers"]
    for name in ("celery.beat", "celery.worker.strategy", "celery.app.trace"):
        assert "quiet_sweeps" in loggers[name]["filters"]
    assert any(isinstance(f, QuietPeriodicTasks) for f in logging.getLogger("celery.beat").filters)


@pytest.mark.parametrize(("status", "traceback"), [(403, False), (404, False), (500, True)])
def test_a_refusal_is_logged_without_its_traceback_a_server_error_with_it(
    caplog: pytest.LogCaptureFixture, status: int, traceback: bool
) -> None:
    """Through Django's own `log_response` and the configured `django.request` logger."""
    caplog.set_level(logging.WARNING, logger="django.request")
    try:
        raise PermissionDenied("no")
    except PermissionDenied as exc:
        log_response(
            "%s", "/admin/x/", response=HttpResponse(status=status),
            request=RequestFactory().post("/admin/x/"), exception=exc,
        )  # fmt: skip
    (record,) = [r for r in caplog.records if r.name == "django.request"]
    assert record.status_code == status  # type: ignore[attr-defined]
    assert (record.exc_info is not None) is traceback
