"""OpenAPI: every operation documents the error responses it can really give, in one place.

Errors share one shape (`restapi.errors.error_body`); which statuses an
operation can answer follows from what it is, so the rules live here rather
than in a decorator on each view:

- 400 when it takes a request body or query parameters (bad input);
- 401 when it requires an API key;
- 403 when a permission class other than "is authenticated" guards it, or when
  the view names the method in `KEY_GRANTS_CHECKED` (the key's grants can refuse
  it: a session's role the key does not hold, a session value above its grant);
- 404 when its path names a resource (an id that does not exist or is not yours);
- 409 when it POSTs to an existing resource (its state does not allow the action);
- 413 and 415 when it takes a request body (too large, not JSON);
- 429 when it requires an API key (an address with repeated failed
  authentication is slowed down before its key is read) or is throttled;
- any other status the operation gives an example of (a 404 for an id in its body).
"""

from typing import Any

from drf_spectacular.openapi import AutoSchema
from drf_spectacular.plumbing import build_examples_list
from drf_spectacular.utils import OpenApiExample, OpenApiParameter
from rest_framework import permissions, serializers

ERROR_DESCRIPTIONS = {
    400: "Bad input: malformed JSON, a wrong or unknown field, a parameter out of range.",
    401: "No API key, a malformed Authorization header, or an invalid or revoked key.",
    403: "The API key may not do this.",
    404: "No such resource, or it belongs to another user.",
    409: "The resource's current state does not allow this (e.g. a turn is running).",
    413: "The request body or a field in it is too large.",
    415: "The request body is not application/json.",
    429: "Too many requests; retry after the number of seconds in Retry-After.",
}

# What each status looks like, shown on every operation that can answer it. An operation's
# own example for a status (`OpenApiExample(..., status_codes=[409], response_only=True)`
# in its extend_schema) replaces the generic one.
ERROR_EXAMPLES: dict[int, tuple[str, str, dict[str, Any]]] = {
    400: ("malformed_json", "request body is not valid JSON", {}),
    401: ("authentication_failed", "Invalid or revoked API key.", {}),
    403: ("permission_denied", "You do not have permission to perform this action.", {}),
    404: ("not_found", "not found", {}),
    409: ("conflict", "the resource's current state does not allow this", {}),
    413: ("payload_too_large", "request body is larger than 2621440 bytes", {"limit": 2621440}),
    415: ("unsupported_media_type", 'Unsupported media type "text/plain" in request.', {}),
    429: (
        "rate_limited",
        "Request was throttled. Expected available in 12 seconds.",
        {"retry_after_s": 12},
    ),
}


def error_example(
    status: int, code: str, message: str, details: dict[str, Any] | None = None, *, name: str = ""
) -> OpenApiExample:
    """An error response example in the one error shape, for an operation's extend_schema."""
    return OpenApiExample(
        name or code,
        value={"error": {"code": code, "message": message, "details": details or {}}},
        status_codes=[status],
        response_only=True,
    )


# A view's attribute: the HTTP methods a key's grants can refuse with 403 (role_not_held,
# value_not_allowed; sessions/services/grants.py).
KEY_GRANTS_CHECKED = "key_grants_checked"

# Permission classes that only say "an API key is required" (covered by 401).
_KEY_ONLY_PERMISSIONS = (permissions.AllowAny, permissions.IsAuthenticated)


class ErrorDetailSerializer(serializers.Serializer):
    code = serializers.CharField(help_text="Stable, machine-readable error code.")
    message = serializers.CharField(help_text="What went wrong, for a person.")
    details = serializers.DictField(help_text="Structured context, e.g. the offending field.")


class ErrorSerializer(serializers.Serializer):
    """The one shape of every API error."""

    error = ErrorDetailSerializer()


def operation_text_trim(operation: dict[str, Any]) -> None:
    """Descriptions are written as indented triple-quoted blocks (sessions/api/docs.py): the
    schema carries them without the blank first and last lines."""
    if isinstance(operation.get("description"), str):
        operation["description"] = operation["description"].strip()


class ErrorDocumentingAutoSchema(AutoSchema):
    def get_operation(self, *args: Any, **kwargs: Any) -> dict[str, Any] | None:
        operation = super().get_operation(*args, **kwargs)
        if operation is None:
            return None
        operation_text_trim(operation)
        responses = operation.setdefault("responses", {})
        ref = self.resolve_serializer(ErrorSerializer, "response").ref
        for status in self._error_statuses(operation):
            examples = self._error_examples(status) or [self._error_example(status, operation)]
            response: dict[str, Any] = {
                "description": ERROR_DESCRIPTIONS[status],
                "content": {
                    "application/json": {"schema": ref, "examples": build_examples_list(examples)}
                },
            }
            if status == 429:
                response["headers"] = {
                    "Retry-After": {"schema": {"type": "integer"}, "description": "Seconds."}
                }
            responses.setdefault(str(status), response)
        return operation

    def _error_example(self, status: int, operation: dict[str, Any]) -> OpenApiExample:
        """The generic example of a status; a 400 without a body is about a query parameter."""
        query = [p["name"] for p in operation.get("parameters", []) if p.get("in") == "query"]
        if status == 400 and "requestBody" not in operation and query:
            name = query[-1]
            return error_example(400, "invalid_input", f"{name} is not valid", {"field": name})
        return error_example(status, *ERROR_EXAMPLES[status])

    def _error_examples(self, status: int) -> list[OpenApiExample]:
        """The operation's own examples of this error status."""
        return [
            e
            for e in self.get_examples()
            if e.response_only and str(status) in {str(c) for c in e.status_codes or ()}
        ]

    def _error_statuses(self, operation: dict[str, Any]) -> list[int]:
        parameters = operation.get("parameters", [])
        has_body = "requestBody" in operation
        has_query = any(p.get("in") == "query" for p in parameters)
        has_path = any(p.get("in") == "path" for p in parameters)
        security: list[dict[str, Any]] = operation.get("security") or []
        needs_key = bool(security) and {} not in security
        view_permissions = self.view.get_permissions()
        statuses = []
        if has_body or has_query:
            statuses.append(400)
        if needs_key:
            statuses.append(401)
        if any(not isinstance(p, _KEY_ONLY_PERMISSIONS) for p in view_permissions) or (
            self.method in getattr(self.view, KEY_GRANTS_CHECKED, ())
        ):
            statuses.append(403)
        if has_path:
            statuses.append(404)
        if has_path and self.method == "POST":
            statuses.append(409)
        if has_body:
            statuses += [413, 415]
        if needs_key or self.view.get_throttles():
            statuses.append(429)
        # A status the operation gives an example of is one it answers (a 404 for an id
        # named in the body, say), wherever its path is silent about it.
        statuses += [s for s in ERROR_DESCRIPTIONS if s not in statuses and self._error_examples(s)]
        return sorted(statuses)


# The header of the requests that may be retried (docs/api.md "Retried requests").
IDEMPOTENCY_KEY_PARAMETER = OpenApiParameter(
    "Idempotency-Key",
    str,
    OpenApiParameter.HEADER,
    description="Makes a retry safe (1-200 printable ASCII characters, kept 24 h per owner): "
    "the same key with the same request returns the first response and does nothing again; "
    "with another request, 409 `idempotency_key_reused`.",
)
