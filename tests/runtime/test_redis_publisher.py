"""runtime/redis_publisher.py against the real Redis: frames from any thread arrive,
in each publisher's order, with no reply ever sent back; a broken or missing Redis
costs frames, never a caller's time or an exception."""

import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.conf import settings

from runtime import redis_publisher
from runtime.redis_publisher import Publisher


@pytest.fixture
def admin() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(settings.REDIS_URL)
    yield client
    client.close()


class Listener:
    """A subscriber to one fresh channel, collecting what arrives on a thread of its own."""

    def __init__(self, client: redis.Redis) -> None:
        self.channel = f"test-publisher-{uuid.uuid4()}".encode()
        self.received: list[bytes] = []
        self._pubsub = client.pubsub(ignore_subscribe_messages=True)
        self._pubsub.subscribe(self.channel)
        self._pubsub.get_message(timeout=1)  # the subscription's confirmation
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._listen, daemon=True)
        self._thread.start()

    def _listen(self) -> None:
        while not self._done.is_set():
            message = self._pubsub.get_message(timeout=0.05)
            if message is not None:
                self.received.append(message["data"])

    def wait_for(self, count: int, timeout: float = 5.0) -> list[bytes]:
        deadline = time.monotonic() + timeout
        while len(self.received) < count and time.monotonic() < deadline:
            time.sleep(0.01)
        return list(self.received)

    def close(self) -> None:
        self._done.set()
        self._thread.join(2)
        self._pubsub.close()


@pytest.fixture
def listener(admin: redis.Redis) -> Iterator[Listener]:
    listening = Listener(admin)
    yield listening
    listening.close()


def _publisher(name: str) -> Publisher:
    return Publisher({"address": settings.REDIS_URL, "client_name": name})


def _client_of(admin: redis.Redis, name: str) -> dict[str, Any] | None:
    return next((c for c in admin.client_list() if c.get("name") == name), None)


@pytest.fixture
def connected(listener: Listener) -> Iterator[tuple[str, Publisher]]:
    """A publisher under a client name of its own whose first frame has arrived."""
    name = f"pub-{uuid.uuid4().hex[:8]}"
    publisher = _publisher(name)
    publisher.publish(listener.channel, [b"first"])
    assert listener.wait_for(1) == [b"first"]
    yield name, publisher
    publisher.close()


def _wait_for_drops_beyond(publisher: Publisher, dropped: int) -> bool:
    deadline = time.monotonic() + 5
    while publisher.dropped == dropped and time.monotonic() < deadline:
        time.sleep(0.01)
    return publisher.dropped > dropped


def test_frames_from_many_threads_arrive_whole_and_in_each_threads_order(
    listener: Listener,
) -> None:
    publisher = _publisher(f"pub-{uuid.uuid4().hex[:8]}")

    def publish(thread: int) -> None:
        for n in range(0, 200, 2):
            # Bytes RESP gives meaning to, inside a payload: lengths, not delimiters, frame it.
            publisher.publish(
                listener.channel, [b"%d:%d\r\n$" % (thread, n), b"%d:%d" % (thread, n + 1)]
            )

    threads = [threading.Thread(target=publish, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    received = listener.wait_for(800)
    assert len(received) == 800
    for t in range(4):
        mine = [int(p.split(b":")[1].split(b"\r")[0]) for p in received if p.startswith(b"%d:" % t)]
        assert mine == list(range(200))
    assert publisher.dropped == 0
    publisher.close()


def test_redis_sends_no_replies_to_read(listener: Listener, admin: redis.Redis) -> None:
    """Replies are off: a thousand PUBLISHes leave nothing to read on the connection
    (with replies on, a thousand `:1` would wait there), and Redis buffers none."""
    name = f"pub-{uuid.uuid4().hex[:8]}"
    publisher = _publisher(name)
    for n in range(1000):
        publisher.publish(listener.channel, [b"%d" % n])
    assert len(listener.wait_for(1000)) == 1000

    connection = publisher._connection
    assert connection is not None
    assert connection.can_read(timeout=0.2) is False
    client = _client_of(admin, name)
    assert client is not None and client["omem"] == "0" and client["cmd"] == "publish"
    publisher.close()


def test_a_connection_redis_closed_is_replaced_before_the_next_frame(
    listener: Listener, admin: redis.Redis, connected: tuple[str, Publisher]
) -> None:
    name, publisher = connected
    client = _client_of(admin, name)
    assert client is not None

    admin.client_kill_filter(_id=client["id"])
    time.sleep(0.2)  # the close reaches the publisher's socket
    publisher.publish(listener.channel, [b"after", b"and more"])

    assert listener.wait_for(3) == [b"first", b"after", b"and more"]
    replacement = _client_of(admin, name)
    assert replacement is not None and replacement["id"] != client["id"]


def test_an_unreachable_redis_drops_frames_without_raising_or_retrying_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    started: list[str] = []
    original_thread = threading.Thread

    def thread(*args: Any, **kwargs: Any) -> threading.Thread:
        started.append(kwargs.get("name", ""))
        return original_thread(*args, **kwargs)

    monkeypatch.setattr(redis_publisher.threading, "Thread", thread)
    publisher = Publisher({"address": f"redis://127.0.0.1:{port}/0"})

    publisher.publish(b"nowhere", [b"first"])  # queued while a thread tries to connect
    assert _wait_for_drops_beyond(publisher, 0)  # the failed connect gave the queued frame up

    dropped = publisher.dropped
    publisher.publish(b"nowhere", [b"second"])  # within RETRY_S: dropped, no new attempt
    assert publisher.dropped > dropped
    assert started == ["redis-publisher"]


def test_a_host_redis_py_refuses_is_tried_again_later(monkeypatch: pytest.MonkeyPatch) -> None:
    """An option redis-py does not know fails the connecting thread, which must still
    hand over: frames are dropped and the next publish after RETRY_S tries again."""
    monkeypatch.setattr(redis_publisher, "RETRY_S", 0.05)
    publisher = Publisher({"address": settings.REDIS_URL, "no_such_option": 1})

    for attempt in (1, 2):
        dropped = publisher.dropped
        publisher.publish(b"nowhere", [b"frame %d" % attempt])
        assert _wait_for_drops_beyond(publisher, dropped), f"attempt {attempt} kept its frame"
        time.sleep(0.1)


def test_a_forked_child_publishes_on_a_connection_of_its_own(
    listener: Listener, admin: redis.Redis, connected: tuple[str, Publisher]
) -> None:
    """Two processes writing to one socket would interleave their commands' bytes."""
    name, publisher = connected
    published, checked = os.pipe(), os.pipe()

    pid = os.fork()
    if pid == 0:  # the child: publish, wait for the parent's look, leave without teardown
        try:
            publisher.publish(listener.channel, [b"child"])
            deadline = time.monotonic() + 5
            while publisher._connection is None and time.monotonic() < deadline:
                time.sleep(0.01)
            os.write(published[1], b"1")
            os.read(checked[0], 1)
        finally:
            os._exit(0)
    try:
        os.read(published[0], 1)
        connections = [c for c in admin.client_list() if c.get("name") == name]
    finally:
        os.write(checked[1], b"1")
        os.waitpid(pid, 0)
    publisher.publish(listener.channel, [b"parent again"])  # the parent's connection is intact

    assert len(connections) == 2
    assert sorted(listener.wait_for(3)) == [b"child", b"first", b"parent again"]
