"""Every API error in one shape: {"error": {"code", "message", "details"}}."""

import logging
import math
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import Http404
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler

from record.errors import DomainError
from record.json_limits import JsonRejected
from record.states import IllegalTransition

logger = logging.getLogger(__name__)


def error_body(code: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "details": details or {}}}


def _first_message(detail: Any) -> str:
    if isinstance(detail, dict):
        for field, value in detail.items():
            return f"{field}: {_first_message(value)}"
    if isinstance(detail, list) and detail:
        return _first_message(detail[0])
    return str(detail)


# Refusals a retry of the same request would meet again: said so to the client libraries that
# retry by themselves (the openai SDK obeys `x-should-retry`; DESIGN.md "Requests that may be
# retried"). 408, 429 and 5xx stay retryable, 429 and 503 with Retry-After.
FINAL_STATUSES = frozenset({400, 401, 403, 404, 405, 409, 413, 415, 422})
SHOULD_RETRY = "x-should-retry"


def retry_advice(response: Response) -> Response:
    """Mark a final refusal `x-should-retry: false` (unless already said)."""
    if response.status_code in FINAL_STATUSES and SHOULD_RETRY not in response:
        response[SHOULD_RETRY] = "false"
    return response


def api_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    response = _api_exception_response(exc, context)
    return None if response is None else retry_advice(response)


def _api_exception_response(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, DomainError):
        return Response(error_body(exc.code, exc.message, exc.details), status=exc.status)
    if isinstance(exc, JsonRejected):
        if exc.too_large:
            return Response(
                error_body("payload_too_large", exc.message, exc.details),
                status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
            )
        return Response(
            error_body("invalid_input", exc.message, exc.details),
            status=status.HTTP_400_BAD_REQUEST,
        )
    if isinstance(exc, RequestDataTooBig):
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        return Response(
            error_body(
                "payload_too_large",
                f"request body is larger than {limit} bytes",
                {"limit": limit},
            ),
            status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
        )
    if isinstance(exc, IllegalTransition):
        return Response(error_body("illegal_transition", str(exc)), status=status.HTTP_409_CONFLICT)
    if isinstance(exc, Http404):
        return Response(error_body("not_found", "not found"), status=status.HTTP_404_NOT_FOUND)
    if isinstance(exc, exceptions.APIException):
        response = exception_handler(exc, context)
        if response is None:  # pragma: no cover - DRF handles every APIException
            return None
        codes = {
            exceptions.ParseError: "malformed_json",
            exceptions.NotAuthenticated: "not_authenticated",
            exceptions.AuthenticationFailed: "authentication_failed",
            exceptions.PermissionDenied: "permission_denied",
            exceptions.NotFound: "not_found",
            exceptions.MethodNotAllowed: "method_not_allowed",
            exceptions.UnsupportedMediaType: "unsupported_media_type",
            exceptions.Throttled: "rate_limited",
            exceptions.ValidationError: "invalid_input",
        }
        code = next((c for cls, c in codes.items() if isinstance(exc, cls)), "error")
        details = exc.detail if isinstance(exc.detail, dict) else {}
        message = _first_message(exc.detail)
        if isinstance(exc, exceptions.Throttled) and exc.wait is not None:
            # The same figure as the Retry-After header DRF sets, for clients that read the body.
            details = {"retry_after_s": math.ceil(exc.wait)}
        if isinstance(exc, exceptions.ParseError):
            message = "request body is not valid JSON"
        response.data = error_body(code, message, details if isinstance(details, dict) else {})
        return response
    logger.exception("unhandled API error")
    return Response(
        error_body("internal_error", "something went wrong on our side; it has been logged"),
        status=status.HTTP_500_INTERNAL_SERVER_ERROR,
    )
