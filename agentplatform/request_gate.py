"""At most WEB_MAX_CONCURRENT_REQUESTS HTTP requests of a web process run Django at once.

Django runs each request's sync code on a thread of its own. Two hundred
requests arriving together were two hundred threads contending for one GIL
and DB_POOL_MAX connections, with daphne's loop (accepting, answering,
websocket frames) one more thread among them: every request finished late,
the first ones included. Past the gate, requests wait on the loop, in
arrival order, holding no thread and no connection.

A request's body is read before it queues for the gate (up to BUFFER_BYTES;
a larger one streams on inside), so a slow uploader holds no slot. The slot is
given back when the response starts: what follows is sending, on the loop, and
a long streamed answer (the OpenAI-compatible endpoint's SSE, written from the
loop as the turn runs) must not keep other requests out of Django. An answer
whose head waits on the loop for its status (runtime/deferred_response.py) leaves
the gate earlier, through `scope[GATE_LEAVE]`, when its wait begins.
"""

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from django.conf import settings

from runtime.deferred_response import GATE_LEAVE

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

BUFFER_BYTES = 1 << 20


async def _buffer_body(receive: Receive) -> list[Message]:
    messages: list[Message] = []
    size = 0
    while size <= BUFFER_BYTES:
        message = await receive()
        messages.append(message)
        if message.get("type") != "http.request" or not message.get("more_body"):
            break
        size += len(message.get("body") or b"")
    return messages


def bounded(app: App, limit: int | None = None) -> App:
    """`app` behind a per-loop semaphore of `limit` (default: the setting; 0 = no gate)."""
    limit = settings.WEB_MAX_CONCURRENT_REQUESTS if limit is None else limit
    if limit <= 0:
        return app
    gates: dict[asyncio.AbstractEventLoop, asyncio.Semaphore] = {}

    async def gated(scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http":
            await app(scope, receive, send)
            return
        buffered = await _buffer_body(receive)

        async def replay() -> Message:
            return buffered.pop(0) if buffered else await receive()

        loop = asyncio.get_running_loop()
        gate = gates.get(loop)
        if gate is None:
            gate = gates[loop] = asyncio.Semaphore(limit)
        await gate.acquire()
        held = True

        def leave() -> None:
            nonlocal held
            if held:
                held = False
                gate.release()

        async def send_releasing(message: Message) -> None:
            if message.get("type") == "http.response.start":
                leave()
            await send(message)

        try:
            await app({**scope, GATE_LEAVE: leave}, replay, send_releasing)
        finally:
            leave()

    return gated
