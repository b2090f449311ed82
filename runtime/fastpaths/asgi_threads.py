"""Django's ASGI handler, with the middleware chain and the view run in one thread hop.

Django's own ASGIHandler builds the chain in async mode. Our middlewares and
views are synchronous, so each request crossed between the event loop and a
worker thread once per middleware hook (the `MiddlewareMixin` ones run each
`process_*` through `sync_to_async`, a sync-only middleware in the middle
turned the rest of the chain back with `async_to_sync`): seven or more
crossings, ~4-5 ms of CPU per request, more than the view itself. Here the
chain is built in sync mode, as under WSGI (and as the test client runs it),
and the loop hands the whole request to a thread once. Body reading and the
response's sending stay Django's.

The thread is lent, not made. Django gives every request a
`ThreadSensitiveContext` of its own: asgiref starts a one-thread pool for it at
its first sync call and, when the request ends, another thread to shut that pool
down, two thread starts a request (~0.35 ms of CPU for a request's three hops,
`request_started`, the chain, the response's close). Here each request borrows a
one-thread executor that outlives it (`RequestThreads`): all of one request's
sync code still runs on one thread, so it keeps one database connection from
`request_started` to `request_finished`, and requests in flight at once each
have their own thread, as before.

It relies on Django's handler internals (`load_middleware(is_async=...)`,
`handle`, `get_response_async`, `run_get_response` and `send_response`, where a
`DeferredResponse` settles) and asgiref's `ThreadSensitiveContext`
executor; the versions it was written for are in runtime/fastpaths/__init__.py.
Off, `http_application()` is Django's own ASGIHandler (a `DeferredResponse`
settles in its first middleware then: runtime/deferred_response.py).
"""

import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from asgiref.sync import ThreadSensitiveContext, sync_to_async
from django.core.handlers.asgi import ASGIHandler
from django.http import HttpRequest, HttpResponseBase, HttpResponseServerError

from runtime import fastpaths
from runtime.deferred_response import DeferredResponse, deferred_released, handler_settles

logger = logging.getLogger(__name__)

# Idle threads kept for the next requests. The request gate lets
# WEB_MAX_CONCURRENT_REQUESTS (16) requests into Django at once, so a process
# normally needs that many; beyond this cap a thread ends with its request.
KEEP_IDLE = 32


class _OneThread(ThreadPoolExecutor):
    """A one-thread executor that knows whether work it was given is still unfinished."""

    def __init__(self) -> None:
        super().__init__(max_workers=1, thread_name_prefix="http-request")
        self._count_lock = threading.Lock()
        self.unfinished = 0

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> "Future[Any]":
        with self._count_lock:
            self.unfinished += 1
        future = super().submit(fn, *args, **kwargs)
        # Added before asyncio wraps the future, so it runs before the loop
        # learns the result: once the request is over, the count is settled.
        future.add_done_callback(self._finished)
        return future

    def _finished(self, _: "Future[Any]") -> None:
        with self._count_lock:
            self.unfinished -= 1


class RequestThreads:
    """The one-thread executors requests borrow, one request at a time each."""

    def __init__(self, keep: int = KEEP_IDLE) -> None:
        self.keep = keep
        self._lock = threading.Lock()
        self._idle: list[_OneThread] = []

    def lend(self) -> _OneThread:
        with self._lock:
            if self._idle:
                return self._idle.pop()  # the one used last: its caches are warm
        return _OneThread()

    def give_back(self, executor: _OneThread) -> None:
        """Keep it for the next request, unless it is still busy or enough are kept.

        A request whose client went away is cancelled on the loop while its view
        may still run on the thread: that executor is not lent again, its
        thread ends once the view returns.
        """
        with self._lock:
            if executor.unfinished == 0 and len(self._idle) < self.keep:
                self._idle.append(executor)
                return
        executor.shutdown(wait=False)

    def forget(self) -> None:
        """Drop the idle executors: the next requests start threads of their own
        (an executor's thread ends once nothing refers to the executor)."""
        with self._lock:
            self._idle = []

    def after_fork(self) -> None:
        # A forked child has none of the parent's threads: the executors it
        # inherited would queue work for a thread that is not there, and the
        # lock may have been held by one of them.
        self._lock = threading.Lock()
        self._idle = []


request_threads = RequestThreads()
os.register_at_fork(after_in_child=lambda: request_threads.after_fork())


class SyncChainASGIHandler(ASGIHandler):
    """Django's handler with the sync chain, settling a `DeferredResponse` on the loop
    between the view and the head (the sync chain's DeferredResponseMiddleware cannot)."""

    def __init__(self) -> None:
        # Not ASGIHandler.__init__: that builds the async chain. This handler settles a
        # deferred response itself, on the loop: DeferredResponseMiddleware stays out.
        token = handler_settles.set(True)
        try:
            self.load_middleware(is_async=False)
        finally:
            handler_settles.reset(token)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await super().__call__(scope, receive, send)  # Django's error for it
            return
        executor = request_threads.lend()
        try:
            async with ThreadSensitiveContext(executor=executor):
                await self.handle(scope, receive, send)
        finally:
            request_threads.give_back(executor)

    async def get_response_async(self, request: HttpRequest) -> HttpResponseBase:
        response: Any = await sync_to_async(self.get_response, thread_sensitive=True)(request)
        return response

    async def run_get_response(self, request: HttpRequest) -> HttpResponseBase:
        response = await super().run_get_response(request)
        if isinstance(response, DeferredResponse):
            await deferred_released(request)
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


def http_application() -> ASGIHandler:
    """The HTTP application daphne serves: this one, or Django's with the fast path off
    (there runtime.deferred_response.DeferredResponseMiddleware settles a DeferredResponse)."""
    if fastpaths.enabled("asgi_threads"):
        return SyncChainASGIHandler()
    return ASGIHandler()
