"""The websocket consumer's fan-out: one serialisation per frame, one database read per session.

In-process (Channels' WebsocketCommunicator) against the real channel layer
(Redis Pub/Sub) and PostgreSQL. The counting wrappers below delegate to the
real functions; they only count calls made inside this module's units.
"""

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.contrib.auth import get_user_model

from agentplatform.asgi import application
from record import publisher
from record.events import EventType
from record.models import Event, Session
from sessions import consumers, selectors
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
    monkeypatch.setattr(selectors, "events_page", _counted(calls, "events", selectors.events_page))
    sockets = await _open(session, key, SOCKETS)
    try:
        # A socket is accepted before it authenticates and replays: let the replays end.
        await asyncio.sleep(0.5)
        connect_reads = calls.count("events")
        calls.clear()
        idle_from = time.monotonic()
        await asyncio.sleep(1.0)  # about three resync periods, nothing new
        idle = list(calls)
        periods = (time.monotonic() - idle_from) / settings.WS_RESYNC_S
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
    # One read of the sessions' heads per period for all the sockets, no per-socket poll
    # (a loaded machine may stretch the sleep or skip a beat: the bound follows the clock).
    assert "events" not in idle
    heads = idle.count("heads")
    assert heads, idle
    assert heads <= int(periods) + 1, (idle, periods)
    assert [(f["seq"], f["data"]) for f in received] == [(1, {"note": "lost"})] * SOCKETS
    # The sockets that were behind shared one read of the missing events.
    assert calls.count("events") == 1, calls


# The per-process feed: one group membership per session, whatever the socket count --------


def _group_members(session: Session) -> set[str]:
    """The channels of this process in the session's group (the Pub/Sub layer's own record)."""
    layer = get_channel_layer()._get_layer()
    return set(
        layer.groups.get(layer._get_group_channel_name(publisher.group_name(session.pk)), ())
    )


def _commit_event(session: Session, seq: int, note: str) -> dict[str, Any]:
    """An event committed as a step commits it; its group message (not sent)."""
    event = Event.objects.create(session=session, seq=seq, type="progress", data={"note": note})
    Session.objects.filter(pk=session.pk).update(event_seq=seq)
    frame = publisher.make_frame(session.pk, seq, EventType.PROGRESS, event.data, event.created_at)
    return publisher.group_message(frame)


async def _publish(session: Session, seq: int, note: str) -> None:
    message = await sync_to_async(_commit_event)(session, seq, note)
    await get_channel_layer().group_send(publisher.group_name(session.pk), message)


async def _notes(ws: WebsocketCommunicator, count: int) -> list[tuple[int, str]]:
    frames = [json.loads(await ws.receive_from(timeout=10)) for _ in range(count)]
    return [(f["seq"], f["data"]["note"]) for f in frames]


async def test_one_group_membership_per_session_per_process():
    session, key = await sync_to_async(_session_and_key)()
    other = await sync_to_async(SessionFactory)(agent=session.agent, owner=session.owner)
    sockets = await _open(session, key, SOCKETS)
    others = await _open(other, key, 2)
    try:
        members, other_members = _group_members(session), _group_members(other)
    finally:
        await _close(sockets + others)
    assert len(members) == 1, members
    assert len(other_members) == 1, other_members
    assert members != other_members
    # The last socket gone, the feed left the group (no subscription left behind).
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 5
    while _group_members(session) or _group_members(other):
        assert loop.time() < deadline, "the feeds never left their groups"
        await asyncio.sleep(0.01)
    assert str(session.pk) not in consumers._watchers().feeds


async def test_every_frame_reaches_every_socket_once_in_order(monkeypatch):
    monkeypatch.setattr(consumers, "FEED_SLICE", 3)  # 7 sockets: three slices per frame
    session, key = await sync_to_async(_session_and_key)()
    sockets = await _open(session, key, 7)
    try:
        for seq in range(1, 6):
            await _publish(session, seq, f"n{seq}")
        received = [await _notes(ws, 5) for ws in sockets]
        extra = [await ws.receive_nothing(timeout=0.3) for ws in sockets]
    finally:
        await _close(sockets)
    assert received == [[(seq, f"n{seq}") for seq in range(1, 6)]] * 7
    assert extra == [True] * 7  # no duplicate


def _commit_step(session: Session, seqs: range) -> None:
    """Events committed together, as one step commits them, then published together."""
    frames = []
    for seq in seqs:
        event = Event.objects.create(
            session=session, seq=seq, type="progress", data={"note": f"s{seq}"}
        )
        frames.append(
            publisher.make_frame(session.pk, seq, EventType.PROGRESS, event.data, event.created_at)
        )
    Session.objects.filter(pk=session.pk).update(event_seq=seqs[-1])
    publisher.publish(session.pk, frames)


async def test_a_steps_frames_in_one_group_message_reach_every_socket_one_by_one():
    """The channel layer carries a step's frames in one message; a socket still gets one
    websocket frame per event, in order, each once."""
    session, key = await sync_to_async(_session_and_key)()
    sockets = await _open(session, key, 3)
    try:
        await sync_to_async(_commit_step)(session, range(1, 5))
        received = [await _notes(ws, 4) for ws in sockets]
        extra = [await ws.receive_nothing(timeout=0.3) for ws in sockets]
    finally:
        await _close(sockets)
    assert received == [[(seq, f"s{seq}") for seq in range(1, 5)]] * 3
    assert extra == [True] * 3


async def _all_notes(ws: WebsocketCommunicator) -> list[tuple[int, str]]:
    """Every frame the socket has, up to a quiet 0.3 s."""
    notes = []
    while not await ws.receive_nothing(timeout=0.3):
        frame = json.loads(await ws.receive_from(timeout=1))
        notes.append((frame["seq"], frame["data"]["note"]))
    return notes


async def test_a_socket_gone_mid_fan_out_does_not_stop_the_others(monkeypatch):
    monkeypatch.setattr(consumers, "FEED_SLICE", 2)
    session, key = await sync_to_async(_session_and_key)()
    sockets = await _open(session, key, 6)
    watchers = consumers._watchers()
    in_feed_order = list(watchers.feeds[str(session.pk)].sockets)
    broken, leaving = in_feed_order[0], in_feed_order[3]

    async def broken_send(message: dict[str, Any]) -> None:
        # The first socket's connection broke; the fourth closes during this fan-out
        # (after the feed took its list of sockets for the frame).
        watchers.discard(leaving)
        raise ConnectionResetError("peer gone")

    monkeypatch.setattr(broken, "base_send", broken_send)
    try:
        await _publish(session, 1, "first")
        await _publish(session, 2, "second")
        received = [await _all_notes(ws) for ws in sockets]
    finally:
        await _close(sockets)
    both = [(1, "first"), (2, "second")]
    assert sorted(received, key=len) == [[], []] + [both] * 4, received


async def test_a_feed_restarted_after_a_channel_layer_failure_loses_no_frame(monkeypatch, settings):
    settings.FEED_RESTART_S = 0.5
    settings.WS_RESYNC_S = 60  # the feed's restart resyncs the sockets, not the periodic task
    session, key = await sync_to_async(_session_and_key)()
    sockets = await _open(session, key, 3)
    layer = get_channel_layer()
    feed = consumers._watchers().feeds[str(session.pk)]
    receive = layer.receive
    failures = [ConnectionError("the channel layer's connection dropped")]

    async def failing_once(channel: str) -> dict[str, Any]:
        if failures:
            raise failures.pop()
        return await receive(channel)

    try:
        await _publish(session, 1, "before")
        assert [await _notes(ws, 1) for ws in sockets] == [[(1, "before")]] * 3
        # The feed's next receive fails: it leaves the group and rejoins after 0.5 s.
        monkeypatch.setattr(layer, "receive", failing_once)
        await _publish(session, 2, "trigger")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5
        while feed.restarts == 0:
            assert loop.time() < deadline, "the feed never failed"
            await asyncio.sleep(0.01)
        await _publish(session, 3, "while down")  # reaches no feed
        received = [await _notes(ws, 2) for ws in sockets]
        await _publish(session, 4, "after")
        received = [r + await _notes(ws, 1) for r, ws in zip(received, sockets, strict=True)]
        extra = [await ws.receive_nothing(timeout=0.3) for ws in sockets]
    finally:
        await _close(sockets)
    # Frame 3 came from the database (the resync after the restart), before frame 4 was sent.
    assert received == [[(2, "trigger"), (3, "while down"), (4, "after")]] * 3
    assert extra == [True] * 3
    assert feed.restarts == 1


async def test_after_past_the_last_event_is_refused_with_4400_and_the_last_seq():
    """A client resuming from a seq the session never reached would take every frame up to
    it for one already seen and wait for ever: it is told, and where the stream ends."""
    session, key = await sync_to_async(_session_and_key)()
    await sync_to_async(Session.objects.filter(pk=session.pk).update)(event_seq=3)

    def connect(after: int) -> WebsocketCommunicator:
        return WebsocketCommunicator(
            application,
            f"/ws/sessions/{session.pk}/?after={after}",
            headers=[(b"authorization", f"Bearer {key}".encode())],
        )

    past = connect(4)
    connected, _ = await past.connect(timeout=10)
    assert connected  # accepted, then told why and closed
    error = json.loads(await past.receive_from(timeout=5))
    assert error["type"] == "error" and error["data"]["code"] == "invalid_input"
    assert error["data"]["details"] == {"field": "after", "last_seq": 3}
    assert (await past.receive_output(timeout=5)) == {"type": "websocket.close", "code": 4400}

    at_end = connect(3)  # resuming from the last event is fine
    connected, _ = await at_end.connect(timeout=10)
    assert connected
    assert await at_end.receive_nothing(timeout=0.5)
    await at_end.disconnect()


async def test_a_frame_daphne_refuses_to_send_is_answered_with_an_error_frame_and_a_close(
    monkeypatch,
):
    """A frame the server cannot send (daphne refuses a message over 1 MiB) is never
    dropped silently: the socket gets an error frame naming the event and the REST page
    that holds it, then a close (a reconnect with `after` resumes the stream)."""
    session, key = await sync_to_async(_session_and_key)()
    sockets = await _open(session, key, 2)
    refusing = list(consumers._watchers().feeds[str(session.pk)].sockets)[0]
    real_send = refusing.base_send

    async def refuse_big(message: dict[str, Any]) -> None:
        if len(message.get("text") or "") > 2000:
            raise ValueError("message too big")  # as autobahn refuses one over its limit
        await real_send(message)

    monkeypatch.setattr(refusing, "base_send", refuse_big)
    monkeypatch.setattr(refusing, "_protocol", None)  # through ASGI, as daphne's slow path
    try:
        await _publish(session, 1, "x" * 3000)
        got = [json.loads(await ws.receive_from(timeout=10)) for ws in sockets]
        told = sockets[[f["type"] for f in got].index("error")]
        closed = await told.receive_output(timeout=10)
    finally:
        await _close(sockets)
    error = next(f for f in got if f["type"] == "error")
    assert [f["type"] for f in got].count("progress") == 1  # the other socket got it whole
    url = f"/api/v1/sessions/{session.pk}/events/?after=0&limit=1"
    assert error["data"]["code"] == "event_not_sent"
    assert error["data"]["details"] == {
        "seq": 1,
        "type": "progress",
        "event_bytes": error["data"]["details"]["event_bytes"],
        "url": url,
    }
    assert "event 1 (progress)" in error["data"]["message"] and url in error["data"]["message"]
    assert closed == {"type": "websocket.close", "code": 1011}
