"""One asyncio loop per process, on its own thread, shared by every run.

Celery runs the engine on worker threads. Model streams and HTTP tools are
async; handing them to one long-lived loop lets many runs share one HTTP
connection pool, instead of each thread spinning up (and tearing down) a loop
and sockets of its own; session frames are published from here too
(record/publisher.py).
"""

import asyncio
import os
import threading
from collections.abc import Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_pid: int | None = None
# This process's id, kept current across fork (os.getpid() is a system call).
_this_pid = os.getpid()


def _forked() -> None:
    global _this_pid
    _this_pid = os.getpid()


os.register_at_fork(after_in_child=_forked)


def get_loop() -> asyncio.AbstractEventLoop:
    global _loop, _pid
    loop, pid = _loop, _pid
    # Every tool batch and network model call asks for the loop: once it runs, no lock.
    if loop is not None and pid == _this_pid:
        return loop
    with _lock:
        # A forked child inherits the variable but not the thread running it.
        if _loop is None or _pid != _this_pid:
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="io-loop", daemon=True)
            thread.start()
            _loop, _pid = loop, _this_pid
        return _loop


def submit(coro: Coroutine[Any, Any, T]) -> "Future[T]":
    """Schedule a coroutine on the shared loop; returns a thread-safe future."""
    return asyncio.run_coroutine_threadsafe(coro, get_loop())


def run(coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
    """Run a coroutine on the shared loop and block this (non-loop) thread for its result."""
    return submit(coro).result(timeout)


def run_inline(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine that never suspends (no I/O, no waiting) to its end on this thread.

    The hop to the shared loop and back costs more than such a coroutine's
    work. One that does suspend is closed and RuntimeError raised: nothing
    outside it was left waiting.
    """
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    coro.close()
    raise RuntimeError("a coroutine run inline suspended")
