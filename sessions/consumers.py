"""Websocket edge: replay persisted events after `?after=`, then stream live ones.

Live frames come from a per-process feed (`_Feed`): ONE channel-layer group
membership per session per process, however many sockets of that session the
process holds. The feed receives and decodes each frame once and hands its text
to the session's sockets, `FEED_SLICE` sockets per event-loop turn so a frame to
500 watchers does not hold the loop for the whole fan-out. Before, every socket
was a member of the group: each frame was queued, decoded and dispatched (a task
wake-up) 500 times per process. On daphne a frame's bytes are built once and
written straight to each socket (runtime/fastpaths/daphne_frames.py), past daphne's and
autobahn's per-socket send path.

No gap, no duplicate: a socket registers with its session's feed (which is
subscribed by then) before its replay query; frames that arrive while it reads
the database wait in its `_behind` list, and `last_seq` drops the ones the read
already sent. A jump in `seq` (a lost notification) is filled from the database.
A feed whose receive loop fails (a channel-layer error) starts again after
`FEED_RESTART_S` and then every socket of the session re-reads the database, so
what was published while it was down is not lost.

Fan-out cost: the publisher serialises a frame once and every socket forwards
that text. Database reads are per session, not per socket: the sockets of one
session in this process share each read of missing events (`_Watchers.rows_after`),
and one task per process re-reads the sessions' last seq every `WS_RESYNC_S`
(one query for all of them) and wakes only the sockets that are behind.
"""

import asyncio
import json
import logging
import time
import uuid
import weakref
from collections import deque
from dataclasses import dataclass
from typing import Any, NamedTuple
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from channels.layers import get_channel_layer
from django.conf import settings

from accounts import limits
from accounts.origins import websocket_origin_allowed
from accounts.selectors import api_key_is_active, api_key_roles
from accounts.services import api_key_authenticate, key_group_name
from observability import metrics
from record.errors import DomainError, NotFound
from record.event_limits import events_url, text_within_limit
from record.events import EventType
from record.json_limits import JsonRejected, json_loads
from record.publisher import frame_text, group_name, make_frame, texts_of
from runtime.fastpaths import daphne_frames

from . import selectors, services
from .api.serializers import MessageCreateSerializer

logger = logging.getLogger(__name__)

CLOSE_UNAUTHORIZED = 4401
CLOSE_INTERNAL_ERROR = 1011
CLOSE_NOT_FOUND = 4404
CLOSE_BAD_REQUEST = 4400
# Too many failed authentications from this address, or too many open sockets for this key.
CLOSE_RATE_LIMITED = 4429
MAX_FRAME_BYTES = 256 * 1024
# Browsers cannot set headers on a websocket, and a key in the URL ends up in
# access logs: a browser offers the subprotocols [WS_SUBPROTOCOL, "bearer.<key>"];
# the server answers WS_SUBPROTOCOL and never echoes the key.
WS_SUBPROTOCOL = "agentplatform.v1"
KEY_SUBPROTOCOL_PREFIX = "bearer."


# One read of missing events returns at most this many (and EVENTS_PAGE_MAX_BYTES of
# payload); a socket further behind reads on.
CATCH_UP_PAGE = 500
Row = tuple[int, str]  # (seq, the frame's JSON text)


class _Rows(NamedTuple):
    rows: list[Row]
    more: bool  # events after the last row exist


def _rows_after(session_id: str, after: int) -> _Rows:
    """Persisted events after `after`, each serialised once for every socket that needs it.

    An event too large to send (stored before EVENT_MAX_BYTES) goes as a small frame
    pointing to its REST page: sending it would close the socket with 1011.
    """
    page = selectors.events_page(session_id=session_id, after=after, limit=CATCH_UP_PAGE)
    return _Rows(
        [
            (
                e.seq,
                text_within_limit(
                    frame_text(make_frame(e.session_id, e.seq, e.type, e.data, e.created_at))
                ),
            )
            for e in page.events
        ],
        page.more,
    )


# Sockets served per event-loop turn in a fan-out: between slices the loop runs
# other work (REST requests, pings), so a frame to 500 sockets is ten short turns.
FEED_SLICE = 50


class _Feed:
    """A session's live frames for this process's sockets of it: one group membership.

    Started by the session's first socket (`start`), stopped with its last
    (`stop`). The receive loop hands each frame's text to every registered
    socket in order; if it fails it joins again after FEED_RESTART_S and every
    socket then re-reads the database (`_resync_from`), so what was published
    meanwhile still arrives, once.
    """

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.group = group_name(session_id)
        # Insertion-ordered: earlier sockets get a frame first, every frame in the same order.
        self.sockets: dict[SessionConsumer, None] = {}
        self.joined: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.restarts = 0
        self._task: asyncio.Task[None] | None = None

    def start(self, previous: "asyncio.Task[None] | None") -> None:
        self._task = asyncio.ensure_future(self._run(previous))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait([self._task])  # its `finally` has left the group
        if not self.joined.done():
            self.joined.cancel()

    async def _run(self, previous: "asyncio.Task[None] | None") -> None:
        if previous is not None:
            # The session's former feed is leaving the group: join after it has
            # left, or its leaving could unsubscribe this one.
            await asyncio.wait([previous])  # (not gather: cancelling this must not cancel it)
        layer = get_channel_layer()
        assert layer is not None  # settings.CHANNEL_LAYERS
        channel = None  # kept across restarts: one subscription of the process's own
        while True:
            try:
                if channel is None:
                    channel = await layer.new_channel(prefix="feed.")
                await layer.group_add(self.group, channel)
                started = asyncio.get_running_loop().time()
                if not self.joined.done():
                    self.joined.set_result(None)
                else:
                    # Frames published while the feed was down went nowhere.
                    self._resync_all(started)
                while True:
                    message = await layer.receive(channel)
                    for seq, text in texts_of(message):
                        # Too large a frame would close every socket with 1011.
                        await self._fan_out(seq, text_within_limit(text))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - restarted below; sockets resync then
                logger.warning(
                    "websocket feed of session %s failed; restarting in %s s",
                    self.session_id,
                    settings.FEED_RESTART_S,
                    exc_info=True,
                )
                if not self.joined.done():
                    # The first join failed: the sockets waiting for it fail as a
                    # group_add of their own would have.
                    self.joined.set_exception(exc)
                    self.joined.exception()  # retrieved: no "never retrieved" warning
                    return
            finally:
                if channel is not None:
                    await self._leave(layer, channel)
            self.restarts += 1
            await asyncio.sleep(settings.FEED_RESTART_S)

    async def _leave(self, layer: Any, channel: str) -> None:
        try:
            await layer.group_discard(self.group, channel)
        except Exception:  # noqa: BLE001 - a dead connection holds no subscription
            logger.debug("websocket feed: leaving %s failed", self.group, exc_info=True)

    def _resync_all(self, started: float) -> None:
        for consumer in list(self.sockets):
            consumer._resync_soon(started)

    async def _fan_out(self, seq: int | None, text: str) -> None:
        now = asyncio.get_running_loop().time()
        # A copy: sockets come and go during the awaits between slices.
        sockets = list(self.sockets)
        frame = _LiveFrame(text)  # one for every socket (daphne never changes a message)
        for start in range(0, len(sockets), FEED_SLICE):
            if start:
                await asyncio.sleep(0)  # let the loop serve others between slices
            for consumer in sockets[start : start + FEED_SLICE]:
                if consumer in self.sockets:  # not gone since the copy
                    try:
                        await consumer._on_frame(seq, frame, now)
                    except Exception:  # noqa: BLE001 - one broken socket never stops the others
                        logger.warning("websocket send failed", exc_info=True)
                        await consumer._unsent(frame.message["text"])


class _LiveFrame:
    """A frame from the feed, shared by every socket of the session: its ASGI message
    and, built on first use, its bytes on the wire (runtime/fastpaths/daphne_frames.py)."""

    __slots__ = ("message", "_wire")

    def __init__(self, text: str) -> None:
        self.message = {"type": "websocket.send", "text": text}
        self._wire: bytes | None = None

    @property
    def wire(self) -> bytes:
        if self._wire is None:
            self._wire = daphne_frames.text_frame(self.message["text"])
        return self._wire


@dataclass
class _Read:
    after: int
    started: float  # loop time; the read sees every event committed before it
    rows: "asyncio.Future[_Rows]"


class _Watchers:
    """The open sockets of this process (one event loop), by session."""

    def __init__(self) -> None:
        # The sockets that stream (their feed has joined the session's group).
        self.by_session: dict[str, set[SessionConsumer]] = {}
        self.feeds: dict[str, _Feed] = {}
        self._stopping: dict[str, asyncio.Task[None]] = {}
        self._reads: dict[str, _Read] = {}
        self._resync: asyncio.Task[None] | None = None

    async def add(self, consumer: "SessionConsumer") -> None:
        """Register the socket with its session's feed; return once the feed is in
        the group (every frame published from then on reaches the socket)."""
        session_id = consumer.session_id
        feed = self.feeds.get(session_id)
        if feed is None:
            feed = self.feeds[session_id] = _Feed(session_id)
            feed.start(previous=self._stopping.get(session_id))
        feed.sockets[consumer] = None
        try:
            await asyncio.shield(feed.joined)
        except BaseException:
            self._unregister(feed, consumer)
            raise
        if consumer not in feed.sockets:  # closed while its feed was joining
            return
        self.by_session.setdefault(session_id, set()).add(consumer)
        if self._resync is None:
            self._resync = asyncio.ensure_future(self._resync_while_watched())

    def discard(self, consumer: "SessionConsumer") -> None:
        sockets = self.by_session.get(consumer.session_id)
        if sockets is not None:
            sockets.discard(consumer)
            if not sockets:
                del self.by_session[consumer.session_id]
                self._reads.pop(consumer.session_id, None)
        feed = self.feeds.get(consumer.session_id)
        if feed is not None:
            self._unregister(feed, consumer)

    def _unregister(self, feed: _Feed, consumer: "SessionConsumer") -> None:
        feed.sockets.pop(consumer, None)
        if feed.sockets or self.feeds.get(feed.session_id) is not feed:
            return
        # The last socket left: the feed leaves the group (a next socket's feed
        # waits for that, see _Feed._run).
        del self.feeds[feed.session_id]
        stopping = asyncio.ensure_future(feed.stop())
        self._stopping[feed.session_id] = stopping

        def forget(task: "asyncio.Task[None]") -> None:
            if self._stopping.get(feed.session_id) is task:
                del self._stopping[feed.session_id]

        stopping.add_done_callback(forget)

    async def rows_after(self, session_id: str, after: int, not_before: float) -> _Rows:
        """Events of the session after `after`, from a read that started at or after
        `not_before` (so it saw everything committed before then): a read another
        socket started is shared when it qualifies, else a new one starts."""
        read = self._reads.get(session_id)
        if read is None or read.after > after or read.started < not_before:
            read = _Read(
                after=after,
                started=asyncio.get_running_loop().time(),
                rows=asyncio.ensure_future(database_sync_to_async(_rows_after)(session_id, after)),
            )
            if session_id in self.by_session:
                self._reads[session_id] = read
        return await asyncio.shield(read.rows)

    async def _resync_while_watched(self) -> None:
        """Re-read the database now and then, so a notification lost between a
        worker's commit and its publish (a crash) still reaches every client."""
        try:
            while self.by_session:
                await asyncio.sleep(settings.WS_RESYNC_S)
                try:
                    await self._resync_once()
                except Exception:  # noqa: BLE001 - the next period tries again
                    logger.debug("websocket resync failed", exc_info=True)
        finally:
            self._resync = None

    async def _resync_once(self) -> None:
        if not self.by_session:
            return
        started = asyncio.get_running_loop().time()
        heads = await database_sync_to_async(selectors.sessions_event_seq)(
            session_ids=list(self.by_session)
        )
        behind = [
            consumer
            for session_id, head in heads.items()
            for consumer in self.by_session.get(session_id, ())
            # A socket that got a frame since the read began is streaming: a gap
            # it has shows up as a jump in seq and is filled then.
            if consumer.last_seq < head and consumer._last_frame_at < started
        ]
        if behind:
            await asyncio.gather(
                *(consumer._resync_from(started) for consumer in behind), return_exceptions=True
            )


_WATCHERS: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Watchers]" = (
    weakref.WeakKeyDictionary()
)


def _watchers() -> _Watchers:
    loop = asyncio.get_running_loop()
    watchers = _WATCHERS.get(loop)
    if watchers is None:
        watchers = _WATCHERS[loop] = _Watchers()
    return watchers


def _header(scope: dict[str, Any], name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key == name:
            return str(value.decode("latin-1"))
    return None


def _subprotocol_auth(scope: dict[str, Any]) -> tuple[str | None, str | None]:
    """(the subprotocol to answer, the key a browser offered as one)."""
    offered = [str(p) for p in scope.get("subprotocols") or []]
    key = next(
        (p[len(KEY_SUBPROTOCOL_PREFIX) :] for p in offered if p.startswith(KEY_SUBPROTOCOL_PREFIX)),
        None,
    )
    return (WS_SUBPROTOCOL if WS_SUBPROTOCOL in offered else None), key


class SessionConsumer(AsyncWebsocketConsumer):
    session_id: str
    last_seq: int
    group: str | None = None
    _last_frame_at: float = 0.0
    key_id: int | None = None
    key_group: str | None = None
    slot_id: str | None = None
    _access_checked_at: float = 0.0
    _closing: bool = False
    # Frames that arrived during a read of the database (None: no read running);
    # the read's end sends them in order.
    _behind: "deque[tuple[int, _LiveFrame]] | None" = None
    # daphne's protocol of this socket, for writing a live frame's bytes directly.
    _protocol: Any = None
    _resync_task: "asyncio.Task[None] | None" = None

    async def connect(self) -> None:
        if not websocket_origin_allowed(self.scope):
            logger.info("websocket refused: origin %s not allowed", _header(self.scope, b"origin"))
            await self.close()  # before accept: the handshake is refused (HTTP 403)
            return
        query = parse_qs(self.scope.get("query_string", b"").decode("latin-1"))
        token = (query.get("token") or [""])[0]
        subprotocol, offered_key = _subprotocol_auth(self.scope)
        if offered_key:
            token = offered_key
        auth = _header(self.scope, b"authorization")
        if auth and auth.startswith("Bearer "):
            token = auth[len("Bearer ") :].strip()
        await self.accept(subprotocol=subprotocol)
        self._protocol = daphne_frames.daphne_protocol(self.base_send)
        client = self.scope.get("client") or (None, None)
        address = limits.client_address(
            peer=client[0], forwarded_for=_header(self.scope, b"x-forwarded-for")
        )
        authn = await database_sync_to_async(api_key_authenticate)(raw=token, address=address)
        if authn.retry_after_s is not None:
            await self._refuse(
                "rate_limited",
                f"{authn.slow_down_message}; retry in {authn.retry_after_s} s",
                {"retry_after_s": authn.retry_after_s},
            )
            return
        key = authn.api_key
        if key is None:
            await self._fail("not_authenticated", "a valid API key is required", CLOSE_UNAUTHORIZED)
            return
        self.session_id = str(self.scope["url_route"]["kwargs"]["session_id"])
        try:
            session = await database_sync_to_async(selectors.session_get_for_owner)(
                session_id=self.session_id, owner_id=key.owner_id
            )
        except NotFound as exc:
            await self._fail(exc.code, exc.message, CLOSE_NOT_FOUND)
            return
        self.owner_id = key.owner_id
        self.user_label = key.owner.get_username()
        raw_after = (query.get("after") or ["0"])[0] or "0"
        try:
            self.last_seq = max(int(raw_after), 0)
        except ValueError:
            await self._fail(
                "invalid_input", f"after must be an integer; got {raw_after!r}", CLOSE_BAD_REQUEST
            )
            return
        if self.last_seq > session.event_seq:
            # Every frame up to `after` would be taken for one already seen: the client
            # would wait for ever for events it will never be sent.
            await self._send_error(
                "invalid_input",
                f"after={self.last_seq} is past the session's last event "
                f"(seq {session.event_seq}); resume from a seq you received, or 0",
                {"field": "after", "last_seq": session.event_seq},
            )
            await self.close(code=CLOSE_BAD_REQUEST)
            return
        slot_id = uuid.uuid4().hex
        if not await limits.socket_slots.acquire(key_id=key.pk, socket_id=slot_id):
            await self._refuse(
                "too_many_sockets",
                f"this API key already has {settings.WS_MAX_SOCKETS_PER_KEY} websockets open",
                {"limit": settings.WS_MAX_SOCKETS_PER_KEY},
            )
            return
        self.key_id, self.slot_id = key.pk, slot_id
        self._access_checked_at = time.monotonic()
        # Revoking the key tells this group, and every socket of the key closes at once.
        self.key_group = key_group_name(key.pk)
        await self.channel_layer.group_add(self.key_group, self.channel_name)
        self.group = group_name(self.session_id)
        self._lock = asyncio.Lock()
        self._watchers = _watchers()
        async with self._lock:
            self._behind = deque()  # live frames wait until the replay has been sent
            # The session's feed joins its group (once per process) before the read.
            await self._watchers.add(self)
            joined = asyncio.get_running_loop().time()
            metrics.WEBSOCKETS.inc()
            self._counted = True
            try:
                await self._catch_up_then_live(not_before=joined)
            except BaseException:
                # The consumer dies with this (daphne then never calls disconnect()):
                # the feed must not keep it.
                self._watchers.discard(self)
                raise

    async def _resync_from(self, started: float) -> None:
        async with self._lock:
            await self._catch_up_then_live(not_before=started)

    def _resync_soon(self, started: float) -> None:
        """A read of the database in the background (a gap, a restarted feed)."""
        if self._behind is None:
            self._behind = deque()  # set now: frames arriving before the task runs wait
        self._resync_task = asyncio.ensure_future(self._resync_from(started))

    async def disconnect(self, code: int) -> None:
        watchers = getattr(self, "_watchers", None)
        if watchers is not None:
            watchers.discard(self)
        if self._resync_task is not None:
            self._resync_task.cancel()
        if getattr(self, "_counted", False):
            self._counted = False
            metrics.WEBSOCKETS.dec()
        if self.key_group is not None:
            await self.channel_layer.group_discard(self.key_group, self.channel_name)
        if self.key_id is not None and self.slot_id is not None:
            await limits.socket_slots.release(key_id=self.key_id, socket_id=self.slot_id)
            self.slot_id = None

    async def _refuse(self, code: str, message: str, details: dict[str, Any]) -> None:
        await self._send_error(code, message, details)
        await self.close(code=CLOSE_RATE_LIMITED)

    async def _fail(self, code: str, message: str, close_code: int) -> None:
        await self._send_error(code, message)
        await self.close(code=close_code)

    async def _unsent(self, text: str) -> None:
        """A frame that could not be sent (daphne refused it): the socket is told which
        event and where to read it, then closed (its stream has a gap: a reconnect
        with `after` resumes it), never left to miss it silently."""
        if self._closing:
            return
        self._closing = True
        try:
            frame = json.loads(text)
            seq, type_ = frame.get("seq"), str(frame.get("type", ""))
            details: dict[str, Any] = {"seq": seq, "type": type_, "event_bytes": len(text)}
            where = "it is not stored (a live-only frame)"
            if isinstance(seq, int):
                details["url"] = events_url(self.session_id, seq)
                where = f"read it at {details['url']}"
            await self._send_error(
                "event_not_sent", f"event {seq} ({type_}) could not be sent; {where}", details
            )
            await self.close(code=CLOSE_INTERNAL_ERROR)
        except Exception:  # noqa: BLE001 - the connection itself is broken: nothing to tell
            logger.debug("websocket: telling of an unsent frame failed", exc_info=True)

    async def _send_error(
        self, code: str, message: str, details: dict[str, Any] | None = None
    ) -> None:
        frame = make_frame(
            getattr(self, "session_id", ""),
            None,
            EventType.ERROR,
            {"code": code, "message": message, "details": details or {}},
        )
        await self.send(text_data=json.dumps(frame))

    async def _catch_up_then_live(self, not_before: float) -> None:
        """Send what the database holds after `last_seq`, then the frames that came
        meanwhile (those the read did not already send). Under `_lock`."""
        if self._behind is None:
            self._behind = deque()
        behind = self._behind
        try:
            while True:
                await self._catch_up(not_before)
                gap = False
                while behind and not gap:
                    seq, frame = behind.popleft()
                    if seq == self.last_seq + 1:
                        await self._send_live(frame)
                        self.last_seq = seq
                    # A jump: committed before it arrived, a new read has it.
                    gap = seq > self.last_seq
                if not gap:
                    return
                not_before = asyncio.get_running_loop().time()
        finally:
            self._behind = None

    async def _catch_up(self, not_before: float) -> None:
        """Send every persisted event after `last_seq` committed before `not_before`
        (and any later one the read happens to see)."""
        while True:
            read = await self._watchers.rows_after(self.session_id, self.last_seq, not_before)
            for seq, text in read.rows:
                if seq > self.last_seq:
                    await self.send(text_data=text)
                    self.last_seq = seq
            if not read.more:
                return
            # A full page: read the next one (a fresh read, after what was just sent).
            not_before = asyncio.get_running_loop().time()

    # Frames from the session's feed -------------------------------------------------

    async def _on_frame(self, seq: int | None, frame: _LiveFrame, now: float) -> None:
        """A live frame from the feed. In order: the feed awaits this before the next frame."""
        self._last_frame_at = now
        if seq is None:
            await self._send_live(frame)
            return
        if self._behind is not None:  # a read of the database is running: after it
            self._behind.append((seq, frame))
            return
        if seq <= self.last_seq:
            return
        if seq > self.last_seq + 1:
            # The frame was committed before it arrived: a read from now on has it.
            self._resync_soon(now)
            return
        self.last_seq = seq
        await self._send_live(frame)

    async def _send_live(self, frame: _LiveFrame) -> None:
        # Through daphne's protocol when it can take the bytes directly, else ASGI.
        # Either way in order: daphne's ASGI send reaches the same transport
        # synchronously, and a direct write goes behind anything queued there.
        if self._protocol is not None and daphne_frames.write(self._protocol, frame.wire):
            return
        await self.base_send(frame.message)

    # Access, re-checked while the socket is open -----------------------------------

    async def apikey_revoked(self, message: dict[str, Any]) -> None:
        """The key was revoked (accounts.services.api_key_revoke): close at once."""
        await self._close_revoked()

    async def _close_revoked(self) -> None:
        if self._closing:
            return
        self._closing = True
        await self._send_error("key_revoked", "this API key has been revoked")
        await self.close(code=CLOSE_UNAUTHORIZED)

    async def websocket_receive(self, message: dict[str, Any]) -> None:
        """Every client frame first proves the key is still valid and the session still its owner's."""
        if self._closing or self.key_id is None:
            return
        access = await database_sync_to_async(self._access)()
        if access == "revoked":
            await self._close_revoked()
            return
        if access == "not_found":
            self._closing = True
            await self._fail("not_found", "session not found", CLOSE_NOT_FOUND)
            return
        await super().websocket_receive(message)

    def _access(self) -> str:
        """'ok', 'revoked' or 'not_found'. The database is read when the key carries a
        revocation mark (set before a revocation commits) or WS_AUTH_RECHECK_S passed,
        so a revocation by the platform is never missed and any other change is seen soon."""
        if self.key_id is None:  # never authenticated: nothing to be allowed
            return "not_found"
        now = time.monotonic()
        if (
            now - self._access_checked_at < settings.WS_AUTH_RECHECK_S
            and not limits.revocation_marked(key_id=self.key_id)
        ):
            return "ok"
        if not api_key_is_active(key_id=self.key_id):
            return "revoked"
        try:
            selectors.session_get_for_owner(session_id=self.session_id, owner_id=self.owner_id)
        except NotFound:
            return "not_found"
        self._access_checked_at = now
        return "ok"

    # Frames from the client -------------------------------------------------------

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if self.group is None:
            # connect() refused this socket (it is closing): nothing it sends counts.
            return
        if text_data is None or len(text_data) > MAX_FRAME_BYTES:
            await self._send_error(
                "malformed_frame", f"send JSON text frames of at most {MAX_FRAME_BYTES} bytes"
            )
            return
        try:
            payload = json_loads(text_data)
        except JsonRejected as exc:
            await self._send_error("invalid_input", exc.message, exc.details)
            return
        except ValueError:
            await self._send_error("malformed_frame", "frame is not valid JSON")
            return
        if not isinstance(payload, dict) or not isinstance(payload.get("type"), str):
            await self._send_error("malformed_frame", 'expected an object with a "type" string')
            return
        kind = payload["type"]
        try:
            if kind == "user_message":
                # The REST serializer, so a frame and a POST obey the same rules.
                fields = {name: value for name, value in payload.items() if name != "type"}
                message = MessageCreateSerializer(data=fields)
                if not message.is_valid():
                    errors = {
                        name: [str(p) for p in problems]
                        for name, problems in message.errors.items()
                    }
                    name, problems = next(iter(errors.items()))
                    await self._send_error("invalid_input", f"{name}: {problems[0]}", errors)
                    return
                await database_sync_to_async(self._post)(
                    message.validated_data["content"],
                    message.validated_data.get("idempotency_key"),
                    message.validated_data.get("extra_context"),
                    message.validated_data.get("webhook"),
                )
            elif kind == "interrupt":
                await database_sync_to_async(self._interrupt)()
            else:
                await self._send_error(
                    "unknown_frame_type",
                    f"unknown frame type {kind!r}; use user_message or interrupt",
                )
        except DomainError as exc:
            await self._send_error(exc.code, exc.message, exc.details)

    def _post(
        self,
        content: str,
        idempotency_key: str | None,
        extra_context: Any = None,
        webhook: Any = None,
    ) -> None:
        # The ownership check is the post's locking query, as for REST; the key's roles
        # are read now, so a change in the admin counts from the next frame.
        services.message_post_for_owner(
            session_id=self.session_id,
            owner_id=self.owner_id,
            key_roles=api_key_roles(key_id=self.key_id) if self.key_id is not None else [],
            content=content,
            idempotency_key=idempotency_key,
            extra_context=extra_context,
            webhook=webhook,
        )

    def _interrupt(self) -> None:
        session = selectors.session_get_for_owner(
            session_id=self.session_id, owner_id=self.owner_id
        )
        services.session_cancel(
            session=session, reason="interrupted by the client", actor=f"ws:{self.user_label}"
        )


class UnknownRouteConsumer(AsyncWebsocketConsumer):
    """Every websocket path no route matches: an error frame, then close 4404
    (without it, Channels raises "No route found" and daphne answers a 500)."""

    async def connect(self) -> None:
        await self.accept()
        frame = make_frame(
            "",
            None,
            EventType.ERROR,
            {"code": "not_found", "message": "no websocket at this path", "details": {}},
        )
        await self.send(text_data=json.dumps(frame))
        await self.close(code=CLOSE_NOT_FOUND)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        return  # the socket is closing
