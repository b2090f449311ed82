"""runtime.fastpaths.asgi_threads: the middleware chain runs synchronously, in one thread hop,
on a thread the request borrows."""

import asyncio
import json
import threading
from typing import Any

import pytest
from asgiref.sync import SyncToAsync
from django.http import HttpRequest, HttpResponse

from agentplatform.asgi import application, django_asgi_app
from runtime.fastpaths import asgi_threads as asgi_http
from tests.factories import SessionFactory, api_key_for

pytestmark = pytest.mark.django_db(transaction=True)


async def _call(
    path: str, key: str, method: str = "GET", body: bytes = b"", app: Any = application
) -> tuple[int, dict[bytes, bytes], bytes]:
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"127.0.0.1"),
            (b"authorization", f"Bearer {key}".encode()),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
    }
    messages = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop(0)
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    content = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], dict(start["headers"]), content


def test_the_chain_is_built_sync_and_answers_as_before():
    assert not asyncio.iscoroutinefunction(django_asgi_app._middleware_chain)
    session = SessionFactory(owner__username="alice")
    key = api_key_for("alice")
    status, headers, content = asyncio.run(_call(f"/api/v1/sessions/{session.pk}/", key))
    assert status == 200, content
    assert json.loads(content)["id"] == str(session.pk)
    # The security middlewares still run for the API.
    assert headers[b"X-Frame-Options"] == b"DENY"
    assert headers[b"X-Content-Type-Options"] == b"nosniff"
    status, _, content = asyncio.run(
        _call(f"/api/v1/sessions/{session.pk}/messages/", key, "POST", b'{"content": "hi"}')
    )
    assert status == 202, content
    status, _, content = asyncio.run(_call("/api/v1/sessions/", "ap_wrong"))
    assert status == 401 and json.loads(content)["error"]["code"]


_threads: list[int] = []


def thread_spy(get_response):  # type: ignore[no-untyped-def]
    """A sync middleware noting the thread it and the view below it run on."""

    def middleware(request: HttpRequest) -> HttpResponse:
        _threads.append(threading.get_ident())
        response = get_response(request)
        _threads.append(threading.get_ident())
        return response

    return middleware


def test_middlewares_and_view_run_in_one_hop_off_the_loop(settings, monkeypatch):
    # Outermost and innermost, around the sync-only middleware that split the chain before.
    spy = "tests.runtime.fastpaths.test_asgi_threads.thread_spy"
    settings.MIDDLEWARE = [spy, *settings.MIDDLEWARE, spy]
    handler = type(django_asgi_app)()
    _threads.clear()
    hops: list[object] = []
    hop = SyncToAsync.__call__

    async def counted(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        hops.append(self.func)
        return await hop(self, *args, **kwargs)

    monkeypatch.setattr(SyncToAsync, "__call__", counted)
    request = HttpRequest()
    request.method = "GET"
    request.path = request.path_info = "/healthz"
    request.META = {"SERVER_NAME": "127.0.0.1", "SERVER_PORT": "8000", "HTTP_HOST": "127.0.0.1"}

    async def serve() -> tuple[int, int]:
        response = await handler.get_response_async(request)
        return response.status_code, threading.get_ident()

    status, loop_thread = asyncio.run(serve())
    assert status == 200
    assert len(_threads) == 4 and len(set(_threads)) == 1
    assert _threads[0] != loop_thread
    assert len(hops) == 1  # Django's async chain took one per middleware hook


_seen: list[tuple[str, threading.Thread]] = []
_barrier: list[threading.Barrier] = []


def thread_note(get_response):  # type: ignore[no-untyped-def]
    """A sync middleware noting its thread, and waiting at a barrier if one is set."""

    def middleware(request: HttpRequest) -> HttpResponse:
        _seen.append(("view", threading.current_thread()))
        if _barrier:
            _barrier[0].wait()
        return get_response(request)

    return middleware


def _note_signal(**kwargs: Any) -> None:
    _seen.append(("signal", threading.current_thread()))


@pytest.fixture
def noting(settings, monkeypatch):  # type: ignore[no-untyped-def]
    """A handler with the noting middleware, a pool of its own, and the request
    signals noting their thread too."""
    from django.core.signals import request_finished, request_started

    settings.MIDDLEWARE = [
        "tests.runtime.fastpaths.test_asgi_threads.thread_note",
        *settings.MIDDLEWARE,
    ]
    threads = asgi_http.RequestThreads()
    monkeypatch.setattr(asgi_http, "request_threads", threads)
    _seen.clear()
    _barrier.clear()
    request_started.connect(_note_signal)
    request_finished.connect(_note_signal)
    try:
        yield type(django_asgi_app)(), threads
    finally:
        request_started.disconnect(_note_signal)
        request_finished.disconnect(_note_signal)


def test_requests_one_after_another_reuse_one_thread(noting):
    """Each request's sync code (request_started, the chain, request_finished)
    runs on one thread, and the next request finds that thread waiting: no
    thread is started for it, and none to shut its pool down."""
    handler, _ = noting

    async def three() -> list[int]:
        return [(await _call("/healthz", "", app=handler))[0] for _ in range(3)]

    before = threading.active_count()
    assert asyncio.run(three()) == [200, 200, 200]
    assert len(_seen) == 9  # started, view, finished, three times
    assert len({id(thread) for _, thread in _seen}) == 1
    assert _seen[0][1].name.startswith("http-request")
    assert threading.active_count() <= before + 1


def test_requests_at_once_each_get_a_thread(noting):
    """Two requests in flight together run on two threads (each waits at a
    barrier the other must reach), and both threads are kept afterwards."""
    handler, _ = noting
    _barrier.append(threading.Barrier(2, timeout=10))

    async def two() -> list[tuple[int, dict[bytes, bytes], bytes]]:
        return list(await asyncio.gather(*[_call("/healthz", "", app=handler) for _ in range(2)]))

    assert [status for status, _, _ in asyncio.run(two())] == [200, 200]
    views = [thread for kind, thread in _seen if kind == "view"]
    assert len(views) == 2 and views[0] is not views[1]
    _barrier.clear()
    asyncio.run(_call("/healthz", "", app=handler))
    assert _seen[-2][1] in views  # a kept thread served it (its view note)


def test_an_executor_still_busy_is_not_lent_again():
    """A request cancelled on the loop (its client went away) may leave its view
    running on the thread: that executor is shut down, not lent to the next."""
    threads = asgi_http.RequestThreads()
    busy = threads.lend()
    release = threading.Event()
    running = busy.submit(release.wait, 10)
    threads.give_back(busy)
    other = threads.lend()
    assert other is not busy
    release.set()
    assert running.result(timeout=10) is True
    threads.give_back(other)
    assert threads.lend() is other


def test_a_forked_child_forgets_the_kept_threads():
    """The child of a fork has none of its parent's threads: an executor it
    inherited would queue a request's work for a thread that is not there."""
    import os

    threads = asgi_http.request_threads
    kept = threads.lend()
    kept.submit(lambda: None).result(timeout=10)
    threads.give_back(kept)
    pid = os.fork()
    if pid == 0:  # the child: report by exit code only
        os._exit(0 if asgi_http.request_threads.lend() is not kept else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert threads.lend() is kept  # the parent lends it again
