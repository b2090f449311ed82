"""Which browser pages may open a websocket (sessions' and approvers' alike).

A browser sends the page's `Origin` with the handshake and lets any page open a
socket to any host, carrying whatever credentials the page holds; the server is
the one that must say no. Clients that send no Origin (servers, CLIs) are not
browsers acting for someone else, and are authenticated by key alone.
"""

from typing import Any

from django.conf import settings
from django.http.request import split_domain_port, validate_host


def _header(scope: dict[str, Any], name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key == name:
            return str(value.decode("latin-1"))
    return None


def origin_allowed(origin: str, host: str | None) -> bool:
    """Configured origins (WS_ALLOWED_ORIGINS), plus the page's own origin (same host and
    port as the socket, the host being one of ALLOWED_HOSTS)."""
    if origin in settings.WS_ALLOWED_ORIGINS:
        return True
    netloc = origin.split("://", 1)[-1]
    if host is None or netloc != host:
        return False
    domain, _port = split_domain_port(host)
    return bool(domain) and validate_host(domain, settings.ALLOWED_HOSTS)


def websocket_origin_allowed(scope: dict[str, Any]) -> bool:
    """True for a handshake without an Origin, or from an allowed one."""
    origin = _header(scope, b"origin")
    return origin is None or origin_allowed(origin, _header(scope, b"host"))
