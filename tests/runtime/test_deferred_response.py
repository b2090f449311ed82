"""runtime.deferred_response: a response's head waits for its status on the loop, holding
no database connection and no slot of the request gate meanwhile; `close` runs once,
however the response ended."""

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from django.core.handlers.asgi import ASGIHandler
from django.db import connections
from django.http import HttpRequest, HttpResponse
from django.urls import path

from agentplatform.request_gate import bounded
from record.models import Agent
from runtime.deferred_response import DeferredResponse
from runtime.fastpaths.asgi_threads import SyncChainASGIHandler

pytestmark = pytest.mark.django_db(transaction=True)


class _Answer:
    """Settles when `go` is set, with `status`; notes what it saw when it began to wait."""

    def __init__(self, status: int = 502) -> None:
        self.go = asyncio.Event()
        self.status = status
        self.waiting = asyncio.Event()
        self.closed = 0
        self.connection_open_while_waiting: bool | None = None
        self.view_connection: Any = None

    async def settle(self, response: DeferredResponse) -> AsyncIterator[bytes]:
        wrapper = self.view_connection
        self.connection_open_while_waiting = wrapper is not None and wrapper.connection is not None
        self.waiting.set()
        await self.go.wait()
        response.status_code = self.status
        response["Retry-After"] = "3"

        async def body() -> AsyncIterator[bytes]:
            yield json.dumps({"status": self.status}).encode()

        return body()

    async def close(self) -> None:
        self.closed += 1


_answers: list[_Answer] = []


def deferred_view(request: HttpRequest) -> DeferredResponse:
    answer = _answers[0]
    Agent.objects.exists()  # the request's thread opens its connection
    answer.view_connection = connections["default"]
    return DeferredResponse(answer, content_type="application/json")


def plain_view(request: HttpRequest) -> HttpResponse:
    return HttpResponse(b"plain")


urlpatterns = [path("deferred", deferred_view), path("plain", plain_view)]


def _scope(path_: str) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path_,
        "raw_path": path_.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"127.0.0.1")],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
    }


async def _call(app: Any, path_: str, disconnect: asyncio.Event | None = None) -> list[Any]:
    sent: list[dict[str, Any]] = []
    messages = [{"type": "http.request", "body": b"", "more_body": False}]

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop(0)
        await (disconnect or asyncio.Event()).wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(_scope(path_), receive, send)
    return sent


@pytest.fixture(params=["fast_path", "django"])
def handler(request, settings):  # type: ignore[no-untyped-def]
    settings.ROOT_URLCONF = __name__
    _answers.clear()
    return SyncChainASGIHandler() if request.param == "fast_path" else ASGIHandler()


def test_the_status_is_the_settled_one_and_the_wait_holds_no_connection_nor_gate_slot(
    handler: Any,
) -> None:
    answer = _Answer(status=502)
    _answers.append(answer)
    app = bounded(handler, limit=1)

    async def main() -> tuple[list[Any], list[Any]]:
        first = asyncio.ensure_future(_call(app, "/deferred"))
        await asyncio.wait_for(answer.waiting.wait(), 10)
        # The one slot is free while the first request waits: another request gets in.
        second = await asyncio.wait_for(_call(app, "/plain"), 10)
        answer.go.set()
        return await first, second

    first, second = asyncio.run(main())
    assert answer.connection_open_while_waiting is False
    start = first[0]
    assert (start["type"], start["status"]) == ("http.response.start", 502)
    assert (b"Retry-After", b"3") in [(bytes(k).title(), bytes(v)) for k, v in start["headers"]]
    body = b"".join(m.get("body", b"") for m in first if m["type"] == "http.response.body")
    assert json.loads(body) == {"status": 502}
    assert second[0]["status"] == 200
    assert answer.closed == 1


def test_a_client_gone_while_waiting_closes_the_answer_and_sends_nothing(handler: Any) -> None:
    answer = _Answer()
    _answers.append(answer)

    async def main() -> list[Any]:
        gone = asyncio.Event()
        call = asyncio.ensure_future(_call(handler, "/deferred", disconnect=gone))
        await asyncio.wait_for(answer.waiting.wait(), 10)
        gone.set()
        return await asyncio.wait_for(call, 10)

    sent = asyncio.run(main())
    assert sent == []
    assert answer.closed == 1


def test_a_server_that_does_not_settle_first_still_gets_the_body(settings) -> None:  # type: ignore[no-untyped-def]
    """Django's test client (or WSGI) reads the content: the response settles then."""
    answer = _Answer(status=200)
    answer.go.set()
    response = DeferredResponse(answer, content_type="application/json")

    async def read() -> bytes:
        return b"".join([part async for part in response])

    assert json.loads(asyncio.run(read())) == {"status": 200}
    assert answer.closed == 1
