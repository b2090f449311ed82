"""Plain-Django error handlers, so even a URL that matches nothing answers in the API's shape."""

from django.http import HttpRequest, JsonResponse

from .errors import error_body


def json_not_found(request: HttpRequest, exception: Exception | None = None) -> JsonResponse:
    return JsonResponse(error_body("not_found", f"no such resource: {request.path}"), status=404)


def json_server_error(request: HttpRequest) -> JsonResponse:
    return JsonResponse(
        error_body("internal_error", "something went wrong on our side; it has been logged"),
        status=500,
    )
