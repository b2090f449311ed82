"""Keep API keys out of the web server's access log.

Browsers cannot set headers on a websocket, so they send the key as
`?token=` (and playground links may carry `?key=`); daphne logs each request's
full URI. Every place daphne writes a request line goes through here:

- `daphne ... agentplatform.asgi:application` (Procfile, production) writes
  NCSA lines with `daphne.access.AccessLogGenerator`, which its CLI builds
  only after importing the ASGI app; `install()`, called from asgi.py,
  swaps in a redacting subclass at that moment.
- `manage.py runserver` (daphne's) logs through the `django.channels.server`
  logger; `RedactQueryFilter` on that logger redacts its records.
"""

import logging
import sys
from typing import Any
from urllib.parse import unquote_plus

from daphne.access import AccessLogGenerator
from django.conf import settings

# Query parameters whose values are credentials, compared case-insensitively.
SECRET_PARAMS = frozenset({"key", "token", "api_key", "access_token"})
REDACTED = "[redacted]"


def redact_query(uri: str) -> str:
    """The URI with the values of credential query parameters replaced by [redacted]."""
    path, sep, query = uri.partition("?")
    if not sep or not query:
        return uri
    fragment = ""
    if "#" in query:
        query, _, rest = query.partition("#")
        fragment = "#" + rest
    parts = []
    for part in query.split("&"):
        name, eq, _value = part.partition("=")
        if unquote_plus(name).strip().lower() in SECRET_PARAMS:
            part = f"{name}={REDACTED}"
        parts.append(part)
    return f"{path}?{'&'.join(parts)}{fragment}"


def _redact_details(details: Any) -> Any:
    if isinstance(details, dict) and isinstance(details.get("path"), str):
        return {**details, "path": redact_query(details["path"])}
    return details


access_logger = logging.getLogger("daphne.access")


class RedactingAccessLogGenerator(AccessLogGenerator):
    def __call__(self, protocol: str, action: str, details: dict[str, Any]) -> None:
        super().__call__(protocol, action, _redact_details(details))

    def write_entry(
        self,
        host: Any,
        date: Any,
        request: Any,
        status: Any = None,
        length: Any = None,
        ident: Any = None,
        user: Any = None,
    ) -> None:
        """With JSON logs (LOG_FORMAT=json), the request line goes through logging: one
        JSON object like every other line, with `client`, `request_line`, `status`, `length`."""
        if getattr(settings, "LOG_FORMAT", "json") != "json":
            super().write_entry(host, date, request, status, length, ident, user)
            return
        access_logger.info(
            '%s "%s" %s %s',
            host,
            request,
            status or "-",
            length or "-",
            extra={
                "client": str(host),
                "request_line": str(request),
                "status": status,
                "length": length,
            },
        )


class RedactQueryFilter(logging.Filter):
    """For loggers that get daphne's details dict as their record's args (runserver)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, dict):
            record.args = _redact_details(record.args)
        return True


def install() -> None:
    """Make the daphne CLI, if it is the one running this process, build the redacting logger."""
    cli = sys.modules.get("daphne.cli")
    if cli is not None and getattr(cli, "AccessLogGenerator", None) is AccessLogGenerator:
        cli.AccessLogGenerator = RedactingAccessLogGenerator  # type: ignore[attr-defined]
