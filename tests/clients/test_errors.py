"""Error answers become exceptions carrying the error shape, by status family."""

import httpx
import pytest
from agentplatform_client import (
    APIError,
    AuthenticationError,
    AuthError,
    ConflictError,
    NotFoundError,
    PayloadTooLargeError,
    PermissionDeniedError,
    RateLimitError,
    ServerError,
    UnsupportedMediaTypeError,
    ValidationError,
)
from agentplatform_client.errors import error_from_response


def _response(status, body=None, headers=None, text=None):
    if text is not None:
        return httpx.Response(status, text=text, headers=headers)
    return httpx.Response(status, json=body, headers=headers)


@pytest.mark.parametrize(
    ("status", "cls", "family"),
    [
        (400, ValidationError, ValidationError),
        (401, AuthenticationError, AuthError),
        (403, PermissionDeniedError, AuthError),
        (404, NotFoundError, APIError),
        (409, ConflictError, APIError),
        (413, PayloadTooLargeError, ValidationError),
        (415, UnsupportedMediaTypeError, ValidationError),
        (429, RateLimitError, APIError),
        (500, ServerError, APIError),
        (503, ServerError, APIError),
        (418, APIError, APIError),
    ],
)
def test_each_status_maps_to_its_class_with_the_shape(status, cls, family):
    body = {"error": {"code": "some_code", "message": "what happened", "details": {"field": "x"}}}
    error = error_from_response(_response(status, body))
    assert type(error) is cls and isinstance(error, family)
    assert (error.status, error.code, error.message, error.details) == (
        status,
        "some_code",
        "what happened",
        {"field": "x"},
    )
    assert str(error) == f"{status} some_code: what happened"


def test_rate_limit_reads_retry_after_from_the_header_then_the_details():
    body = {
        "error": {"code": "rate_limited", "message": "slow down", "details": {"retry_after_s": 9}}
    }
    with_header = error_from_response(_response(429, body, {"Retry-After": "3"}))
    assert isinstance(with_header, RateLimitError) and with_header.retry_after == 3.0
    error = error_from_response(_response(429, body))
    assert isinstance(error, RateLimitError) and error.retry_after == 9.0


def test_a_body_of_another_shape_keeps_its_text():
    error = error_from_response(_response(400, text="Bad Request"))
    assert type(error) is ValidationError
    assert (error.code, error.message, error.details) == ("http_400", "Bad Request", {})
