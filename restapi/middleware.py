"""Request checks that apply before any view, the admin's included."""

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse, JsonResponse

from .errors import error_body


class RejectNulInQueryMiddleware:
    """A NUL (`%00`) in a query parameter reaches PostgreSQL as a filter value
    (an admin list filter or search, an API parameter) and fails there with a
    DataError, a 500. No parameter of ours can hold one: answer 400 up front."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        for name, values in request.GET.lists():
            if "\x00" in name or any("\x00" in value for value in values):
                return JsonResponse(
                    error_body(
                        "invalid_input",
                        "query parameters must not contain NUL (%00) characters",
                        {"parameter": name},
                    ),
                    status=400,
                )
        return self.get_response(request)
