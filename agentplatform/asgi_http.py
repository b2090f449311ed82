"""Django's ASGI handler, with the middleware chain and the view run in one thread hop.

Django's own ASGIHandler builds the chain in async mode. Our middlewares and
views are synchronous, so each request crossed between the event loop and a
worker thread once per middleware hook (the `MiddlewareMixin` ones run each
`process_*` through `sync_to_async`, a sync-only middleware in the middle
turned the rest of the chain back with `async_to_sync`): seven or more
crossings, ~4-5 ms of CPU per request, more than the view itself. Here the
chain is built in sync mode, as under WSGI (and as the test client runs it),
and the loop hands the whole request to a thread once. Body reading, the
response's sending and the per-request thread context stay Django's.
"""

from typing import Any

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIHandler
from django.http import HttpRequest, HttpResponseBase


class SyncChainASGIHandler(ASGIHandler):
    def __init__(self) -> None:
        # Not ASGIHandler.__init__: that builds the async chain.
        self.load_middleware(is_async=False)

    async def get_response_async(self, request: HttpRequest) -> HttpResponseBase:
        response: Any = await sync_to_async(self.get_response, thread_sensitive=True)(request)
        return response
