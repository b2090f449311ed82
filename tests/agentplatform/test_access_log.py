"""API keys in query strings are redacted from daphne's access log and runserver's log records."""

import io
import logging
import sys

import pytest

from agentplatform import access_log
from agentplatform.access_log import (
    RedactingAccessLogGenerator,
    RedactQueryFilter,
    redact_query,
)


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("/ws/sessions/abc/?token=SECRET", "/ws/sessions/abc/?token=[redacted]"),
        ("/ws/sessions/abc/?after=5&token=SECRET", "/ws/sessions/abc/?after=5&token=[redacted]"),
        ("/playground/?key=SECRET&x=1", "/playground/?key=[redacted]&x=1"),
        (
            "/a?TOKEN=SECRET&api_key=S2&access_token=S3",
            "/a?TOKEN=[redacted]&api_key=[redacted]&access_token=[redacted]",
        ),
        # Percent-encoded names are still names.
        ("/a?%74oken=SECRET", "/a?%74oken=[redacted]"),
        ("/a?token", "/a?token=[redacted]"),
        ("/a?token=SECRET#frag", "/a?token=[redacted]#frag"),
        # Nothing else changes.
        ("/api/v1/sessions/?limit=5&tokens=1", "/api/v1/sessions/?limit=5&tokens=1"),
        ("/api/v1/sessions/", "/api/v1/sessions/"),
        ("/api/v1/sessions/?", "/api/v1/sessions/?"),
    ],
)
def test_redact_query(uri, expected):
    assert redact_query(uri) == expected


def test_the_access_log_generator_writes_no_secret(settings):
    settings.LOG_FORMAT = "plain"
    stream = io.StringIO()
    log = RedactingAccessLogGenerator(stream)
    log(
        "http",
        "complete",
        {
            "path": "/x/?token=SECRET",
            "status": 200,
            "method": "GET",
            "client": "127.0.0.1:1",
            "size": 2,
        },
    )
    log("websocket", "connecting", {"path": "/ws/sessions/1/?key=SECRET", "client": "127.0.0.1:1"})
    text = stream.getvalue()
    assert "SECRET" not in text
    assert '"GET /x/?token=[redacted]" 200 2' in text
    assert "WSCONNECTING /ws/sessions/1/?key=[redacted]" in text


def test_with_json_logs_the_access_log_goes_through_logging_redacted(settings, caplog):
    settings.LOG_FORMAT = "json"
    stream = io.StringIO()
    log = RedactingAccessLogGenerator(stream)
    with caplog.at_level(logging.INFO, logger="daphne.access"):
        log(
            "http",
            "complete",
            {"path": "/x/?token=SECRET", "status": 200, "method": "GET", "client": "127.0.0.1:1", "size": 2},
        )  # fmt: skip
    assert stream.getvalue() == ""
    (record,) = caplog.records
    assert record.getMessage() == '127.0.0.1:1 "GET /x/?token=[redacted]" 200 2'
    assert (record.request_line, record.status, record.length) == (
        "GET /x/?token=[redacted]",
        200,
        2,
    )


def test_the_runserver_log_filter_redacts_the_record(caplog):
    logger = logging.getLogger("test.access_log")
    logger.addFilter(RedactQueryFilter())
    with caplog.at_level(logging.INFO, logger="test.access_log"):
        logger.info("HTTP %(method)s %(path)s", {"method": "GET", "path": "/a?token=SECRET"})
    assert caplog.messages == ["HTTP GET /a?token=[redacted]"]


def test_settings_put_the_filter_on_runserver_logger():
    filters = logging.getLogger("django.channels.server").filters
    assert any(isinstance(f, RedactQueryFilter) for f in filters)


def test_install_swaps_daphnes_cli_logger_only(monkeypatch):
    import daphne.cli

    monkeypatch.setattr(daphne.cli, "AccessLogGenerator", access_log.AccessLogGenerator)
    access_log.install()
    assert daphne.cli.AccessLogGenerator is RedactingAccessLogGenerator


def test_install_outside_daphnes_cli_changes_nothing(monkeypatch):
    import daphne.cli

    monkeypatch.setattr(daphne.cli, "AccessLogGenerator", access_log.AccessLogGenerator)
    # A process daphne's CLI did not start (Celery, runserver, tests) never imported it.
    monkeypatch.delitem(sys.modules, "daphne.cli")
    access_log.install()
    assert daphne.cli.AccessLogGenerator is access_log.AccessLogGenerator
    assert "daphne.cli" not in sys.modules
