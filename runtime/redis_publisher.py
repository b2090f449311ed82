"""PUBLISH to Redis without waiting for replies, from any thread, in call order.

Publishing a step's frames through redis-py's asyncio pipeline on the io loop
cost about 1 ms of CPU per model + tool iteration (bench/README §1b): the hop
from the engine's thread to the loop and the client's reply handling. A
publisher needs neither. This one keeps a single connection per process and
Redis host, switched to `CLIENT REPLY OFF`, so publishing is writing a few
hand-packed RESP bytes to a socket under a lock: the caller never waits for
Redis, and there are no replies to read.

Order: every publish of the process goes through the same lock and socket, so
frames leave in the order their callers published them (a model call's text
deltas from the io loop before the frames its step commits on a worker thread).

Best effort, as every frame is (clients fill gaps from the database by `seq`):
- A caller never connects. The first publish, or the first after the
  connection broke, starts a thread that connects; meanwhile frames wait in
  order in a bounded buffer, which the thread sends before anyone else.
- A failed connect drops the buffer and waits `RETRY_S` before the next try,
  so a Redis that is down costs a publish only the packing of its bytes.
- With replies off, a connection Redis closed shows as readable (EOF):
  checked before each write, so frames are not written into a dead socket
  after a Redis restart.
"""

import logging
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import redis
from redis.connection import ConnectionInterface

logger = logging.getLogger(__name__)

# The buffer kept while connecting: beyond it the oldest frames are dropped.
MAX_PENDING_BYTES = 4 * 1024 * 1024
RETRY_S = 1.0
# A publisher's writes are small and Redis reads them at once: a write that
# blocks this long means Redis is stuck, and the frames are not worth the wait.
SOCKET_TIMEOUT_S = 2.0

_PUBLISH = b"*3\r\n$7\r\nPUBLISH\r\n$"
_REPLY_OFF = b"*3\r\n$6\r\nCLIENT\r\n$5\r\nREPLY\r\n$3\r\nOFF\r\n"


def packed_publish(channel: bytes, payloads: Sequence[bytes]) -> bytes:
    """The RESP bytes of one PUBLISH per payload, to one channel."""
    head = b"%s%d\r\n%s\r\n$" % (_PUBLISH, len(channel), channel)
    return b"".join(b"%s%d\r\n%s\r\n" % (head, len(payload), payload) for payload in payloads)


def connection_for(host: Mapping[str, Any]) -> ConnectionInterface:
    """A redis-py connection (not yet connected) for a host as channels_redis describes
    one: {"address": url, **options} or {"host": ..., "port": ..., **options}.

    redis-py does the URL, authentication, TLS and the handshake; this module
    only writes to the socket once it is open.
    """
    options = dict(host)
    options["socket_timeout"] = SOCKET_TIMEOUT_S
    options.setdefault("socket_connect_timeout", SOCKET_TIMEOUT_S)
    address = options.pop("address", None)
    if address is not None:
        pool = redis.ConnectionPool.from_url(address, **options)
    else:
        pool = redis.ConnectionPool(**options)
    return pool.make_connection()


class Publisher:
    """One Redis host's publishing connection in this process (see the module's doc)."""

    def __init__(self, host: Mapping[str, Any]) -> None:
        self._host = dict(host)
        self._reset()
        _publishers.add(self)

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._connection: ConnectionInterface | None = None
        self._connecting = False
        self._pending: deque[bytes] = deque()
        self._pending_bytes = 0
        self._retry_at = 0.0
        self.dropped = 0  # frames' bytes given up since the process started (a gauge for tests)

    def publish(self, channel: bytes, payloads: Sequence[bytes]) -> None:
        """Write one PUBLISH per payload, in order, without waiting for Redis."""
        data = packed_publish(channel, payloads)
        with self._lock:
            connection = self._connection
            if connection is not None:
                try:
                    # Replies are off: anything to read is Redis closing the connection.
                    if connection.can_read(timeout=0):
                        raise redis.ConnectionError("closed by the server")
                    connection.send_packed_command([data], check_health=False)
                    return
                except (redis.RedisError, OSError):
                    connection.disconnect()
                    self._connection = None
                    logger.warning("the publishing connection to Redis broke; reconnecting")
            if not self._connecting and time.monotonic() < self._retry_at:
                self.dropped += len(data)
                return
            self._queue(data)
            if not self._connecting:
                self._connecting = True
                threading.Thread(target=self._connect, name="redis-publisher", daemon=True).start()

    def _queue(self, data: bytes) -> None:
        self._pending.append(data)
        self._pending_bytes += len(data)
        while self._pending_bytes > MAX_PENDING_BYTES:
            oldest = self._pending.popleft()
            self._pending_bytes -= len(oldest)
            self.dropped += len(oldest)

    def _connect(self) -> None:
        """Open a connection with replies off, then send what waited, in order.

        1. Connect and turn replies off, outside the lock (this may take a while).
        2. Under the lock, send the waiting frames, then hand the connection to
           the publishers: no frame published meanwhile can overtake them.
        3. On failure, drop the waiting frames and refuse new ones for RETRY_S.
        """
        connection: ConnectionInterface | None = None
        try:
            connection = connection_for(self._host)
            connection.connect()
            connection.send_packed_command([_REPLY_OFF], check_health=False)
            with self._lock:
                if self._pending:
                    connection.send_packed_command(list(self._pending), check_health=False)
                self._pending.clear()
                self._pending_bytes = 0
                self._connecting = False
                self._connection = connection
        except Exception as error:  # noqa: BLE001 - a publisher must never take the process down
            if connection is not None:
                connection.disconnect()
            with self._lock:
                self.dropped += self._pending_bytes
                self._pending.clear()
                self._pending_bytes = 0
                self._connecting = False
                self._retry_at = time.monotonic() + RETRY_S
            logger.warning("cannot publish to Redis (%s); retrying in %.0f s", error, RETRY_S)

    def close(self) -> None:
        with self._lock:
            if self._connection is not None:
                self._connection.disconnect()
                self._connection = None


_publishers: "weakref.WeakSet[Publisher]" = weakref.WeakSet()


def _forget_parents_connections() -> None:
    # A forked child shares the parent's sockets; writing to them would interleave
    # the two processes' bytes. redis-py does not shut down a socket another
    # process opened, so dropping the reference leaves the parent's connection be.
    for publisher in list(_publishers):
        publisher._reset()


os.register_at_fork(after_in_child=_forget_parents_connections)
