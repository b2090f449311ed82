"""Telling a worker, mid-stream, that its session's turn was cancelled.

The durable signal is `Session.cancel_requested` (checked at every step
boundary). This is the fast path that closes a model stream already running:
one Redis Pub/Sub subscription per worker process, on the shared io loop,
wakes the calls it holds for the cancelled session.
"""

import asyncio
import contextlib
import logging
from functools import lru_cache

import redis
from django.conf import settings
from redis import asyncio as aioredis

logger = logging.getLogger(__name__)


def channel() -> str:
    return f"{settings.REDIS_KEY_PREFIX}:cancel"


@lru_cache(maxsize=1)
def _publisher() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2)


def cancel_signal(session_id: object) -> None:
    """Best effort: a lost signal only means the stream runs until the step ends."""
    try:
        _publisher().publish(channel(), str(session_id))
    except redis.RedisError:
        logger.warning("could not publish the cancel of session %s", session_id)


class CancelWatch:
    """Lives on the io loop; maps session ids to the events of the calls waiting on them."""

    def __init__(self) -> None:
        self._waiters: dict[str, set[asyncio.Event]] = {}
        self._task: asyncio.Task[None] | None = None

    def register(self, session_id: object) -> asyncio.Event:
        event = asyncio.Event()
        self._waiters.setdefault(str(session_id), set()).add(event)
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._listen())
        return event

    def unregister(self, session_id: object, event: asyncio.Event) -> None:
        waiters = self._waiters.get(str(session_id))
        if waiters is not None:
            waiters.discard(event)
            if not waiters:
                self._waiters.pop(str(session_id), None)

    async def _listen(self) -> None:
        while True:
            client = aioredis.Redis.from_url(settings.REDIS_URL, socket_timeout=None)
            pubsub = client.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(channel())
                async for message in pubsub.listen():
                    raw = message.get("data")
                    session_id = raw.decode() if isinstance(raw, bytes) else str(raw)
                    for event in list(self._waiters.get(session_id, ())):
                        event.set()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - reconnect; the step boundary still checks the flag
                logger.warning("cancel watch lost Redis; reconnecting", exc_info=True)
                await asyncio.sleep(1)
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()
                    await client.aclose()


_watches: dict[int, CancelWatch] = {}


def cancel_watch() -> CancelWatch:
    """The watch of the running loop (one per process in practice)."""
    loop_id = id(asyncio.get_running_loop())
    watch = _watches.get(loop_id)
    if watch is None:
        watch = _watches[loop_id] = CancelWatch()
    return watch
