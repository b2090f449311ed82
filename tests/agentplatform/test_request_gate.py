"""agentplatform.request_gate: a bounded number of requests in the app, in arrival order."""

import asyncio
import contextlib
from typing import Any

from agentplatform.request_gate import BUFFER_BYTES, bounded


def _receive_from(messages: list[dict[str, Any]]) -> Any:
    async def receive() -> dict[str, Any]:
        await asyncio.sleep(0)
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    return receive


async def _noop_send(_message: Any) -> None:
    return None


def test_at_most_limit_requests_run_at_once_and_they_start_in_arrival_order() -> None:
    running = 0
    peak = 0
    started: list[int] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        started.append(scope["n"])
        await asyncio.sleep(0.01)
        running -= 1

    gated = bounded(app, limit=3)

    async def main() -> None:
        await asyncio.gather(
            *(
                gated(
                    {"type": "http", "n": n},
                    _receive_from([{"type": "http.request", "body": b""}]),
                    _noop_send,
                )
                for n in range(12)
            )
        )

    asyncio.run(main())
    assert peak == 3
    assert started == list(range(12))


def test_the_app_reads_the_whole_body_though_it_was_read_before_the_gate() -> None:
    seen: list[bytes] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            seen.append(message.get("body", b""))
            if not message.get("more_body"):
                return

    chunks = [b"a" * 10, b"b" * 10, b"c"]
    messages = [
        {"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
        for i, c in enumerate(chunks)
    ]
    asyncio.run(bounded(app, limit=1)({"type": "http"}, _receive_from(messages), _noop_send))
    assert b"".join(seen) == b"".join(chunks)


def test_a_large_body_streams_on_inside_the_gate() -> None:
    got = 0
    piece = b"x" * (256 * 1024)
    count = (BUFFER_BYTES // len(piece)) + 4
    messages = [
        {"type": "http.request", "body": piece, "more_body": i < count - 1} for i in range(count)
    ]

    async def app(scope: Any, receive: Any, send: Any) -> None:
        nonlocal got
        while True:
            message = await receive()
            got += len(message.get("body", b""))
            if not message.get("more_body"):
                return

    asyncio.run(bounded(app, limit=1)({"type": "http"}, _receive_from(messages), _noop_send))
    assert got == len(piece) * count
    assert messages == []


def test_limit_zero_is_no_gate() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        return None

    assert bounded(app, limit=0) is app


def test_the_slot_is_given_back_when_the_response_starts() -> None:
    """A streamed answer that runs on after its start does not keep the next request out."""
    release_stream = asyncio.Event()
    second_ran = asyncio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["n"] == 0:
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await release_stream.wait()  # still streaming
            await send({"type": "http.response.body", "body": b""})
        else:
            second_ran.set()

    gated = bounded(app, limit=1)

    async def main() -> None:
        first = asyncio.ensure_future(
            gated({"type": "http", "n": 0}, _receive_from([{"type": "http.request"}]), _noop_send)
        )
        second = asyncio.ensure_future(
            gated({"type": "http", "n": 1}, _receive_from([{"type": "http.request"}]), _noop_send)
        )
        await asyncio.wait_for(second_ran.wait(), 2)
        release_stream.set()
        await asyncio.gather(first, second)

    asyncio.run(main())


def test_an_app_that_fails_before_responding_gives_the_slot_back() -> None:
    calls = 0

    async def app(scope: Any, receive: Any, send: Any) -> None:
        nonlocal calls
        calls += 1
        if scope["n"] == 0:
            raise RuntimeError("boom")

    gated = bounded(app, limit=1)

    async def main() -> None:
        with contextlib.suppress(RuntimeError):
            await gated({"type": "http", "n": 0}, _receive_from([]), _noop_send)
        await asyncio.wait_for(gated({"type": "http", "n": 1}, _receive_from([]), _noop_send), 2)

    asyncio.run(main())
    assert calls == 2
