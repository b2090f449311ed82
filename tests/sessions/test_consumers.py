"""The websocket consumer's fan-out: one serialisation per frame, one database read per session.

In-process (Channels' WebsocketCommunicator) against the real channel layer
(Redis Pub/Sub) and PostgreSQL. The counting wrappers below delegate to the
real functions; they only count calls made inside this module's units.
"""

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.contrib.auth import get_user_model

from agentplatform.asgi import application
from sessions import consumers, publisher, selectors
from sessions.events import EventType
from sessions.models import Event, Session
from tests.factories import AgentFactory, SessionFactory, api_key_for

pytestmark = pytest.mark.django_db(transaction=True)

SOCKETS = 5


class _Counting:
    """A module's `json`, with dumps counted."""

    def __init__(self) -> None:
        self.dumps_calls = 0

    def dumps(self, *args: Any, **kwargs: Any) -> str:
        self.dumps_calls += 1
        return json.dumps(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(json, name)


def _counted(calls: list[str], name: str, func: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        calls.append(name)
        return func(*args, **kwargs)

    return wrapper


def _session_and_key() -> tuple[Session, str]:
    key = api_key_for("watcher")
    session = SessionFactory(
        agent=AgentFactory(slug="echo"), owner=get_user_model().objects.get(username="watcher")
    )
    return session, key


async def _open(session: Session, key: str, count: int) -> list[WebsocketCommunicator]:
    sockets = []
    for _ in range(count):
        ws = WebsocketCommunicator(
            application,
            f"/ws/sessions/{session.pk}/?after=0",
            headers=[(b"authorization", f"Bearer {key}".encode())],
        )
        connected, _ = await ws.connect(timeout=10)
        assert connected
        sockets.append(ws)
    await _joined(session, count)
    return sockets


async def _joined(session: Session, count: int) -> None:
    """Wait until `count` sockets watch the session. A socket is accepted before it
    authenticates and joins the session's group, so a frame sent as soon as
    `connect()` returns could reach no one."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while len(consumers._watchers().by_session.get(str(session.pk), ())) < count:
        assert loop.time() < deadline, "the sockets never joined the session's group"
        await asyncio.sleep(0.01)


async def _close(sockets: list[WebsocketCommunicator]) -> None:
    for ws in sockets:
        await ws.disconnect()


async def test_a_frame_is_serialised_once_and_forwarded_as_is(monkeypatch):
    session, key = await sync_to_async(_session_and_key)()
    consumer_json, publisher_json = _Counting(), _Counting()
    monkeypatch.setattr(consumers, "json", consumer_json)
    monkeypatch.setattr(publisher, "json", publisher_json)
    sockets = await _open(session, key, SOCKETS)
    try:
        frame = publisher.make_frame(session.pk, 1, EventType.PROGRESS, {"note": "hello"})
        message = publisher.group_message(frame)
        await get_channel_layer().group_send(publisher.group_name(session.pk), message)
        received = [await ws.receive_from(timeout=10) for ws in sockets]
    finally:
        await _close(sockets)
    assert publisher_json.dumps_calls == 1  # the group message's text
    assert consumer_json.dumps_calls == 0  # no socket serialises it again
    assert received == [message["text"]] * SOCKETS
    assert json.loads(received[0])["data"] == {"note": "hello"}


async def test_idle_sockets_of_a_session_share_one_resync_read(monkeypatch, settings):
    settings.WS_RESYNC_S = 0.3
    session, key = await sync_to_async(_session_and_key)()
    calls: list[str] = []
    monkeypatch.setattr(
        selectors,
        "sessions_event_seq",
        _counted(calls, "heads", selectors.sessions_event_seq),
    )
    monkeypatch.setattr(
        selectors, "events_after", _counted(calls, "events", selectors.events_after)
    )
    sockets = await _open(session, key, SOCKETS)
    try:
        # A socket is accepted before it authenticates and replays: let the replays end.
        await asyncio.sleep(0.5)
        connect_reads = calls.count("events")
        calls.clear()
        await asyncio.sleep(1.0)  # about three resync periods, nothing new
        idle = list(calls)
        calls.clear()

        # An event committed whose notification never went out (a crash between
        # commit and publish): the resync delivers it to every socket.
        def commit_unpublished() -> None:
            Event.objects.create(session=session, seq=1, type="progress", data={"note": "lost"})
            Session.objects.filter(pk=session.pk).update(event_seq=1)

        await sync_to_async(commit_unpublished)()
        received = [json.loads(await ws.receive_from(timeout=5)) for ws in sockets]
    finally:
        await _close(sockets)
    assert connect_reads in range(1, SOCKETS + 1), connect_reads
    # One read of the sessions' heads per period for all the sockets, no per-socket poll.
    assert "events" not in idle
    assert 2 <= idle.count("heads") <= 4, idle
    assert [(f["seq"], f["data"]) for f in received] == [(1, {"note": "lost"})] * SOCKETS
    # The sockets that were behind shared one read of the missing events.
    assert calls.count("events") == 1, calls
