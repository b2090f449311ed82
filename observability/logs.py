"""Structured logs: one JSON object per line, with the session, turn, step and trace ids.

structlog (maintained, used by many, contextvars built in) formats the standard
library's records, so every logger of the platform, Django and Celery comes out
the same way without changing how code logs. python-json-logger would do the
JSON but not the context binding or the processor chain we need for scrubbing.

The ids come from contextvars the engine binds around a step (`bound`); a log
line inside a step carries them whatever module writes it. The trace id comes
from the current span when traces are on. Every line is scrubbed
(redaction.scrub) before it is written.
"""

import logging
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import structlog

from . import tracing
from .redaction import scrub, scrub_value

# One context variable holding a small dict: a step binds and resets it once (about a
# microsecond), where structlog's per-key variables cost one set and reset per key.
_ids: ContextVar[dict[str, Any]] = ContextVar("log_ids", default={})  # noqa: B039 - never mutated


@contextmanager
def bound(**ids: Any) -> Iterator[None]:
    """Log lines written inside carry these ids (session, turn, step, ...)."""
    token = _ids.set({**_ids.get(), **ids})
    try:
        yield
    finally:
        _ids.reset(token)


def _merge_ids(
    _logger: Any, _name: str, event: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    for key, value in _ids.get().items():
        event.setdefault(key, value)
    return event


def _trace_id(
    _logger: Any, _name: str, event: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    trace_id = tracing.current_trace_id()
    if trace_id:
        event.setdefault("trace_id", trace_id)
    return event


_PLAIN = (str, int, float, bool, type(None), dict, list, tuple)


def _scrub(_logger: Any, _name: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    for key, value in event.items():
        # An object (a request, say) would be rendered by its repr, unscrubbed: make it text first.
        event[key] = scrub_value(value if isinstance(value, _PLAIN) else str(value))
    return event


EXTRA_FIELDS = ["client", "request_line", "status", "length", "status_code"]


class JsonFormatter(structlog.stdlib.ProcessorFormatter):
    """`{"ts", "level", "logger", "event", "session", "turn", "step", "trace_id", "exception"?}`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(
            foreign_pre_chain=[
                _merge_ids,
                structlog.stdlib.add_log_level,
                structlog.stdlib.add_logger_name,
                # Fields passed as `extra=`: the access log's, and Django's status code (not
                # its `request` object, whose repr holds the whole URL).
                structlog.stdlib.ExtraAdder(allow=EXTRA_FIELDS),
                structlog.processors.TimeStamper(fmt="iso", utc=True, key="ts"),
                _trace_id,
            ],
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                _scrub,
                structlog.processors.JSONRenderer(),
            ],
        )


class ScrubbingFormatter(logging.Formatter):
    """The plain text format (LOG_FORMAT=plain), scrubbed the same way."""

    def format(self, record: logging.LogRecord) -> str:
        return scrub(super().format(record))
