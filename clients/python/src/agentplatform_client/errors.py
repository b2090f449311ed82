"""Exceptions: every API error carries the platform's error shape.

The server answers every error as `{"error": {"code", "message", "details"}}` with
an HTTP status; the websocket closes with 44xx after an `error` frame of the same
shape. Both become an `APIError` subclass chosen by status family, so callers catch
`NotFoundError` or `RateLimitError` instead of comparing numbers.
"""

from __future__ import annotations

import json
from typing import Any

import httpx


class AgentPlatformError(Exception):
    """Base of everything this library raises."""


class APIConnectionError(AgentPlatformError):
    """The server could not be reached (or the websocket could not be reopened in time)."""


class APIError(AgentPlatformError):
    """An error answer of the API: HTTP status plus the DESIGN error shape."""

    def __init__(
        self,
        *,
        status: int,
        code: str,
        message: str,
        details: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.details: dict[str, Any] = details or {}
        self.headers: dict[str, str] = headers or {}


class ValidationError(APIError):
    """400: bad input (`invalid_input`, `malformed_json`, ...); `details` says where."""


class PayloadTooLargeError(ValidationError):
    """413: a body, content or metadata over its limit."""


class UnsupportedMediaTypeError(ValidationError):
    """415: a body that is not JSON."""


class AuthError(APIError):
    """401 or 403: the key is missing, wrong or revoked, or lacks a right."""


class AuthenticationError(AuthError):
    """401 (or websocket close 4401)."""


class PermissionDeniedError(AuthError):
    """403: e.g. a key without approver rights on the approvals API."""


class NotFoundError(APIError):
    """404 (or websocket close 4404): nothing with that id for this key's user."""


class ConflictError(APIError):
    """409: e.g. `approval_resolved`, `turn_in_progress`, an idempotency key reused."""


class RateLimitError(APIError):
    """429 (or websocket close 4429); `retry_after` is in seconds when the server said."""

    @property
    def retry_after(self) -> float | None:
        raw = self.headers.get("retry-after")
        if raw is None:
            raw = self.details.get("retry_after_s")
        try:
            return float(raw) if raw is not None else None
        except (TypeError, ValueError):
            return None


class ServerError(APIError):
    """5xx: the server failed, or is not ready (503)."""


_BY_STATUS: dict[int, type[APIError]] = {
    400: ValidationError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    409: ConflictError,
    413: PayloadTooLargeError,
    415: UnsupportedMediaTypeError,
    429: RateLimitError,
}

# The websocket's close codes: 4000 + the HTTP status they stand for.
WS_CLOSE_STATUS = {4400: 400, 4401: 401, 4403: 403, 4404: 404, 4429: 429}


def error_class(status: int) -> type[APIError]:
    if status in _BY_STATUS:
        return _BY_STATUS[status]
    if status >= 500:
        return ServerError
    if status == 422:
        return ValidationError
    return APIError


def error_from_shape(
    status: int, body: Any, headers: dict[str, str] | None = None, fallback: str = ""
) -> APIError:
    """An exception from an error body; a body of another shape keeps its text as the message."""
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        code = str(error.get("code") or f"http_{status}")
        message = str(error.get("message") or fallback)
        details = error.get("details") if isinstance(error.get("details"), dict) else {}
    else:
        code, message, details = f"http_{status}", fallback or f"HTTP {status}", {}
    return error_class(status)(
        status=status, code=code, message=message, details=details, headers=headers
    )


def error_from_response(response: httpx.Response) -> APIError:
    try:
        body = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError):
        body = None
    headers = {k.lower(): v for k, v in response.headers.items()}
    return error_from_shape(response.status_code, body, headers, response.text[:500])
