"""A response whose status is decided on the event loop after the view returned.

Django sends a response's status line and headers the moment the view's response
reaches the handler. An answer that only knows its status once something outside
the request has happened (the OpenAI-compatible endpoint: 200 with the turn's
answer, or 502 when no model could answer) cannot be an ordinary response, and
must not wait on the request's thread either: a thread and a pooled database
connection per waiting request would cap the platform at a few dozen of them.

So the view returns a `DeferredResponse` at once, carrying an `Answer`: the
handler (`DeferringASGIHandler`) then

1. gives the request thread's database connection back to the pool (the view's
   thread is otherwise parked with it until the response ends) and leaves the
   request gate (`GATE_LEAVE` in the scope: agentplatform/request_gate.py), so the
   wait holds no connection and no slot;
2. awaits `Answer.settle` on the loop, which sets the status and headers and
   returns the body, and only then sends the head and the body;
3. calls `Answer.close` when the response is over however it ended (sent, failed,
   or cancelled by the client going away).

A server that does not know this protocol (WSGI, Django's test client) still gets a
body: the response settles when its content is first read, too late for its status.
"""

import logging
from collections.abc import AsyncIterator
from typing import Any, Protocol

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIHandler
from django.db import connection
from django.http import (
    HttpRequest,
    HttpResponseBase,
    HttpResponseServerError,
    StreamingHttpResponse,
)

logger = logging.getLogger(__name__)

# The scope key under which the request gate hands the app a way to leave it early.
GATE_LEAVE = "agentplatform.gate_leave"


class Answer(Protocol):
    async def settle(self, response: "DeferredResponse") -> AsyncIterator[bytes]:
        """Wait for what decides the status; set it (and headers) on `response`; return the body."""
        ...

    async def close(self) -> None:
        """The response is over: sent, failed or abandoned. Called once."""
        ...


class DeferredResponse(StreamingHttpResponse):
    """A streamed response whose head waits for `settle()`."""

    def __init__(self, answer: Answer, **kwargs: Any) -> None:
        self.answer = answer
        self._body: AsyncIterator[bytes] | None = None
        self._closed = False
        super().__init__(self._content(), **kwargs)

    async def settle(self) -> None:
        if self._body is None:
            self._body = await self.answer.settle(self)

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            await self.answer.close()

    async def _content(self) -> AsyncIterator[bytes]:
        try:
            await self.settle()  # already done under DeferringASGIHandler
            assert self._body is not None
            async for part in self._body:
                yield part
        finally:
            await self.aclose()


def _give_back_connection() -> None:
    if not connection.in_atomic_block:
        connection.close()


class DeferringASGIHandler(ASGIHandler):
    """Django's ASGI handler, settling a `DeferredResponse` before its head is sent."""

    async def run_get_response(self, request: HttpRequest) -> HttpResponseBase:
        response = await super().run_get_response(request)
        if isinstance(response, DeferredResponse):
            # On the request's own thread (thread-sensitive): that is where its connection is.
            await sync_to_async(_give_back_connection, thread_sensitive=True)()
            leave = getattr(request, "scope", {}).get(GATE_LEAVE)
            if leave is not None:
                leave()
        return response

    async def send_response(self, response: HttpResponseBase, send: Any) -> None:
        if not isinstance(response, DeferredResponse):
            await super().send_response(response, send)
            return
        try:
            try:
                await response.settle()
            except Exception:
                logger.exception("a deferred response failed to settle")
                await super().send_response(HttpResponseServerError(), send)
                return
            await super().send_response(response, send)
        finally:
            await response.aclose()
