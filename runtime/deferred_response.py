"""A response whose status is decided on the event loop after the view returned.

Django sends a response's status line and headers the moment the view's response
reaches the handler. An answer that only knows its status once something outside
the request has happened (the OpenAI-compatible endpoint: 200 with the turn's
answer, or 502 when no model could answer) cannot be an ordinary response, and
must not wait on the request's thread either: a thread and a pooled database
connection per waiting request would cap the platform at a few dozen of them.

So the view returns a `DeferredResponse` at once, carrying an `Answer`: the first
middleware (`DeferredResponseMiddleware`, or the fast path's handler in
runtime/fastpaths/asgi_threads.py) then

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

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextvars import ContextVar
from typing import Any, Protocol

from asgiref.sync import markcoroutinefunction, sync_to_async
from django.core.exceptions import MiddlewareNotUsed
from django.core.handlers.asgi import ASGIRequest
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
            await self.settle()  # already done by the middleware or the fast path's handler
            assert self._body is not None
            async for part in self._body:
                yield part
        finally:
            await self.aclose()


def _give_back_connection() -> None:
    if not connection.in_atomic_block:
        connection.close()


# Set while a handler that settles deferred responses itself builds its middleware chain
# (runtime/fastpaths/asgi_threads.py): the middleware stays out of that chain.
handler_settles: ContextVar[bool] = ContextVar("handler_settles", default=False)


class DeferredResponseMiddleware:
    """The first middleware: it settles a `DeferredResponse` on the event loop (async only:
    Django runs the rest of the chain on the request's thread) before the handler sends
    its head, having given the request thread's connection back and left the request gate."""

    sync_capable = False
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Awaitable[Any]]) -> None:
        if handler_settles.get():
            raise MiddlewareNotUsed
        self.get_response = get_response
        markcoroutinefunction(self)

    async def __call__(self, request: HttpRequest) -> HttpResponseBase:
        response = await self.get_response(request)
        if not isinstance(response, DeferredResponse) or not isinstance(request, ASGIRequest):
            return response
        await deferred_released(request)
        try:
            await response.settle()
        except asyncio.CancelledError:  # the client went away
            await response.aclose()
            raise
        except Exception:
            logger.exception("a deferred response failed to settle")
            await response.aclose()
            return HttpResponseServerError()
        return response


async def deferred_released(request: HttpRequest) -> None:
    """What a deferred response holds no longer: the connection of the request's thread
    (on that thread: thread-sensitive) and its slot in the request gate."""
    await sync_to_async(_give_back_connection, thread_sensitive=True)()
    leave = getattr(request, "scope", {}).get(GATE_LEAVE)
    if leave is not None:
        leave()
