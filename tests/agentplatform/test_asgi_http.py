"""agentplatform.asgi_http: the middleware chain runs synchronously, in one thread hop."""

import asyncio
import json
import threading
from typing import Any

import pytest
from asgiref.sync import SyncToAsync
from django.http import HttpRequest, HttpResponse

from agentplatform.asgi import application, django_asgi_app
from tests.factories import SessionFactory, api_key_for

pytestmark = pytest.mark.django_db(transaction=True)


async def _call(
    path: str, key: str, method: str = "GET", body: bytes = b""
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

    await application(scope, receive, send)
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
    spy = "tests.agentplatform.test_asgi_http.thread_spy"
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
