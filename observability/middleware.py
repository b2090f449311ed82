"""The REST request's span: the root of a turn's trace when the turn starts from a request.

Not used at all (MiddlewareNotUsed) when traces are off, so it costs nothing then.
Only `/api/` and `/openai/` requests get a span; the caller's `traceparent` header,
if any, is its parent.
"""

from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.core.exceptions import MiddlewareNotUsed
from django.http import HttpRequest, HttpResponse

from . import tracing

TRACED_PREFIXES = ("/api/", "/openai/")


class TraceRequestMiddleware:
    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        if not tracing.enabled():
            raise MiddlewareNotUsed
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        if self.is_async:
            return self._acall(request)
        if not request.path.startswith(TRACED_PREFIXES):
            return self.get_response(request)
        with tracing.server_span(request.method or "GET", request.path, _parent(request)) as span:
            response: HttpResponse = self.get_response(request)
            span.set_attribute("http.response.status_code", response.status_code)
            return response

    async def _acall(self, request: HttpRequest) -> HttpResponse:
        handler: Callable[[HttpRequest], Awaitable[HttpResponse]] = self.get_response
        if not request.path.startswith(TRACED_PREFIXES):
            return await handler(request)
        with tracing.server_span(request.method or "GET", request.path, _parent(request)) as span:
            response = await handler(request)
            span.set_attribute("http.response.status_code", response.status_code)
            return response


def _parent(request: HttpRequest) -> str | None:
    return request.headers.get("traceparent")
