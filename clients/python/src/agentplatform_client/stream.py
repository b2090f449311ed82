"""A session's events over the websocket, reopened automatically where it left off.

The server replays the persisted events after `?after=SEQ`, then streams live
ones. The stream remembers the last `seq` it handed out; when the socket drops
(network, a daphne restart, a server-side close) it reconnects with backoff from
that seq, so nothing is missed and nothing comes twice:

1. a persisted frame with `seq <= last_seq` is a duplicate (a replay overlapping
   what was already seen) and is dropped;
2. a persisted frame with `seq > last_seq + 1` means frames are missing (the
   server fills gaps itself; this is a second line): they are read from
   `GET .../events/?after=last_seq` and handed out first;
3. ephemeral frames (`seq: null`: text deltas, progress) are passed on as they
   come; the ones sent while the socket was down are gone, but each delta's text
   is in the `message.completed` event that follows.

A close code 4400/4401/4404/4429 is the server refusing the socket: it raises
the matching `APIError` (with the `error` frame's code, message and details)
instead of reconnecting.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import quote

from websockets.asyncio.client import ClientConnection as AsyncConnection
from websockets.asyncio.client import connect as async_connect
from websockets.exceptions import ConnectionClosed, WebSocketException
from websockets.sync.client import ClientConnection as SyncConnection
from websockets.sync.client import connect as sync_connect

from .errors import WS_CLOSE_STATUS, APIConnectionError, APIError, error_from_shape
from .events import Event, parse_event
from .models import SessionRef, session_ref

# An error frame with one of these codes comes right before the server closes the socket:
# it becomes the exception, not an event.
_REFUSAL_CODES = {
    "not_authenticated",
    "key_revoked",
    "not_found",
    "rate_limited",
    "too_many_sockets",
}
_CONNECT_ERRORS = (OSError, TimeoutError, WebSocketException)


@dataclass(frozen=True)
class ReconnectPolicy:
    """How a dropped socket is reopened: exponential backoff with jitter.

    `max_attempts` failed attempts in a row (None: no limit) raise `APIConnectionError`;
    each drop starts counting afresh.
    """

    initial_delay_s: float = 0.2
    max_delay_s: float = 5.0
    max_attempts: int | None = 10
    open_timeout_s: float = 10.0

    def delay(self, attempt: int) -> float:
        base = min(self.max_delay_s, self.initial_delay_s * (2 ** max(attempt - 1, 0)))
        # Jitter spreads reconnects out; it guards nothing, so no secure generator is needed.
        return base * (0.5 + random.random() / 2)  # nosec B311


class _Tracker:
    """The stream's memory: the last seq handed out, and what a frame means."""

    def __init__(self, after: int) -> None:
        self.last_seq = after
        self.refusal: dict[str, Any] | None = None

    def parse(self, raw: str | bytes) -> Event | None:
        """The frame as an event, or None to drop it (a duplicate, or a refusal kept for the close)."""
        try:
            frame = json.loads(raw)
        except ValueError:
            return None
        if not isinstance(frame, dict):
            return None
        event = parse_event(frame)
        if event.seq is None:
            if event.type == "error" and event.data.get("code") in _REFUSAL_CODES:
                self.refusal = event.data
                return None
            return event
        if event.seq <= self.last_seq:
            return None
        return event

    def missing_before(self, event: Event) -> bool:
        return event.seq is not None and event.seq > self.last_seq + 1

    @staticmethod
    def before(event: Event, rows: list[Event]) -> list[Event]:
        """The rows of a gap read that come before `event` (a later read sees more)."""
        if event.seq is None:  # only sequenced events open a gap
            return []
        return [row for row in rows if row.seq is not None and row.seq < event.seq]

    def accept(self, event: Event) -> Event | None:
        """Hand out `event` unless an earlier one already covered its seq."""
        if event.seq is not None:
            if event.seq <= self.last_seq:
                return None
            self.last_seq = event.seq
        return event

    def refused(self, exc: ConnectionClosed) -> APIError | None:
        """The exception for a close that must not be retried, or None to reconnect."""
        code = exc.rcvd.code if exc.rcvd is not None else None
        status = WS_CLOSE_STATUS.get(code or 0)
        if status is None:
            return None
        shape = self.refusal or {"code": f"ws_{code}", "message": f"websocket closed ({code})"}
        self.refusal = None
        return error_from_shape(status, {"error": shape})


def session_ws_url(ws_base: str, session_id: str, after: int) -> str:
    return f"{ws_base}/ws/sessions/{quote(str(session_id))}/?after={after}"


def _user_message(content: str, idempotency_key: str | None) -> str:
    frame: dict[str, Any] = {"type": "user_message", "content": content}
    if idempotency_key is not None:
        frame["idempotency_key"] = idempotency_key
    return json.dumps(frame)


class AsyncEventStream:
    """`async with client.stream(session_id) as stream: async for event in stream: ...`"""

    def __init__(
        self,
        *,
        ws_base: str,
        session_id: SessionRef,
        api_key: str,
        after: int,
        policy: ReconnectPolicy,
        fetch_after: Callable[[int], Awaitable[list[Event]]],
    ) -> None:
        self.session_id = session_ref(session_id)
        self._ws_base = ws_base
        self._headers = {"Authorization": f"Bearer {api_key}"}
        self._policy = policy
        self._fetch_after = fetch_after
        self._tracker = _Tracker(after)
        self._ws: AsyncConnection | None = None
        self._pending: deque[Event] = deque()
        self._filled_for: Event | None = None  # the event whose gap was last read from REST
        self._closed = False
        self.reconnects = 0  # sockets opened after the first

    @property
    def last_seq(self) -> int:
        """The seq of the last persisted event handed out (where a new stream would resume)."""
        return self._tracker.last_seq

    async def __aenter__(self) -> AsyncEventStream:
        await self._open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __aiter__(self) -> AsyncEventStream:
        return self

    async def __anext__(self) -> Event:
        while True:
            if self._pending:
                head = self._pending[0]
                if self._tracker.missing_before(head) and head is not self._filled_for:
                    # Marked only once read: a read cancelled by a timeout is done again.
                    earlier = self._tracker.before(head, await self._fetch_after(self.last_seq))
                    self._filled_for = head
                    self._pending.extendleft(reversed(earlier))
                    continue
                self._pending.popleft()
                if self._tracker.accept(head) is not None:
                    return head
                continue
            if self._closed:
                raise StopAsyncIteration
            if self._ws is None:
                await self._open()
                self.reconnects += 1
                continue
            try:
                raw = await self._ws.recv()
            except ConnectionClosed as exc:
                self._ws = None
                refused = self._tracker.refused(exc)
                if refused is not None:
                    self._closed = True
                    raise refused from None
                continue
            event = self._tracker.parse(raw)
            if event is not None:
                self._pending.append(event)

    async def receive(self, timeout: float | None = None) -> Event:
        """The next event; TimeoutError after `timeout` seconds without one."""
        try:
            return await asyncio.wait_for(self.__anext__(), timeout)
        except StopAsyncIteration:
            raise APIConnectionError("the stream is closed") from None

    async def send_message(self, content: str, *, idempotency_key: str | None = None) -> None:
        """Post a user message over the socket. A frame lost with a dropping socket is not
        retried: pass an idempotency key and repeat it, or use `Client.send_message` (REST)."""
        await (await self._connected()).send(_user_message(content, idempotency_key))

    async def interrupt(self) -> None:
        """Ask the server to stop the running turn (it ends `cancelled`)."""
        await (await self._connected()).send(json.dumps({"type": "interrupt"}))

    async def close(self) -> None:
        self._closed = True
        if self._ws is not None:
            ws, self._ws = self._ws, None
            await ws.close()

    async def drop_connection(self) -> None:
        """Close the socket as a network failure would (the stream reconnects); for tests."""
        if self._ws is not None:
            self._ws.transport.abort()

    async def _connected(self) -> AsyncConnection:
        if self._ws is None:
            await self._open()
            self.reconnects += 1
        if self._ws is None:
            raise APIConnectionError("the websocket could not be opened")
        return self._ws

    async def _open(self) -> None:
        attempt = 0
        while True:
            url = session_ws_url(self._ws_base, self.session_id, self._tracker.last_seq)
            try:
                self._ws = await async_connect(
                    url,
                    additional_headers=self._headers,
                    open_timeout=self._policy.open_timeout_s,
                    max_size=2**24,
                )
                return
            except _CONNECT_ERRORS as exc:
                attempt += 1
                if self._policy.max_attempts is not None and attempt >= self._policy.max_attempts:
                    raise APIConnectionError(
                        f"websocket {url} not reachable after {attempt} attempts: {exc!r}"
                    ) from exc
                await asyncio.sleep(self._policy.delay(attempt))


class EventStream:
    """The blocking twin of AsyncEventStream: `with client.stream(id) as stream: for event in stream`."""

    def __init__(
        self,
        *,
        ws_base: str,
        session_id: SessionRef,
        api_key: str,
        after: int,
        policy: ReconnectPolicy,
        fetch_after: Callable[[int], list[Event]],
    ) -> None:
        self.session_id = session_ref(session_id)
        self._ws_base = ws_base
        self._headers = {"Authorization": f"Bearer {api_key}"}
        self._policy = policy
        self._fetch_after = fetch_after
        self._tracker = _Tracker(after)
        self._ws: SyncConnection | None = None
        self._pending: deque[Event] = deque()
        self._filled_for: Event | None = None  # the event whose gap was last read from REST
        self._closed = False
        self.reconnects = 0

    @property
    def last_seq(self) -> int:
        return self._tracker.last_seq

    def __enter__(self) -> EventStream:
        self._open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> EventStream:
        return self

    def __next__(self) -> Event:
        try:
            return self.receive()
        except APIConnectionError:
            if self._closed:
                raise StopIteration from None
            raise

    def receive(self, timeout: float | None = None) -> Event:
        """The next event; TimeoutError after `timeout` seconds without one."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._pending:
                head = self._pending[0]
                if self._tracker.missing_before(head) and head is not self._filled_for:
                    earlier = self._tracker.before(head, self._fetch_after(self.last_seq))
                    self._filled_for = head
                    self._pending.extendleft(reversed(earlier))
                    continue
                self._pending.popleft()
                if self._tracker.accept(head) is not None:
                    return head
                continue
            if self._closed:
                raise APIConnectionError("the stream is closed")
            if self._ws is None:
                self._open()
                self.reconnects += 1
                continue
            left = None if deadline is None else max(deadline - time.monotonic(), 0)
            try:
                raw = self._ws.recv(timeout=left)
            except ConnectionClosed as exc:
                self._ws = None
                refused = self._tracker.refused(exc)
                if refused is not None:
                    self._closed = True
                    raise refused from None
                continue
            event = self._tracker.parse(raw)
            if event is not None:
                self._pending.append(event)

    def send_message(self, content: str, *, idempotency_key: str | None = None) -> None:
        """See AsyncEventStream.send_message."""
        self._connected().send(_user_message(content, idempotency_key))

    def interrupt(self) -> None:
        self._connected().send(json.dumps({"type": "interrupt"}))

    def close(self) -> None:
        self._closed = True
        if self._ws is not None:
            ws, self._ws = self._ws, None
            ws.close()

    def drop_connection(self) -> None:
        """Cut the socket as a network failure would (the stream reconnects); for tests."""
        if self._ws is not None:
            self._ws.socket.close()

    def _connected(self) -> SyncConnection:
        if self._ws is None:
            self._open()
            self.reconnects += 1
        if self._ws is None:
            raise APIConnectionError("the websocket could not be opened")
        return self._ws

    def _open(self) -> None:
        attempt = 0
        while True:
            url = session_ws_url(self._ws_base, self.session_id, self._tracker.last_seq)
            try:
                # Entered as a context manager: websockets 17 warns about a bare connect().
                # (Before 17 connect() is the connection, whose __enter__ is typed as the base
                # class: the cast keeps both versions' types.)
                self._ws = cast(
                    SyncConnection,
                    sync_connect(
                        url,
                        additional_headers=self._headers,
                        open_timeout=self._policy.open_timeout_s,
                        max_size=2**24,
                    ).__enter__(),
                )
                return
            except _CONNECT_ERRORS as exc:
                attempt += 1
                if self._policy.max_attempts is not None and attempt >= self._policy.max_attempts:
                    raise APIConnectionError(
                        f"websocket {url} not reachable after {attempt} attempts: {exc!r}"
                    ) from exc
                time.sleep(self._policy.delay(attempt))
