"""The stream's bookkeeping: duplicates dropped, gaps filled, refusals raised, reconnects
resumed (against a scripted websocket server on 127.0.0.1)."""

import json

from agentplatform_client import AuthenticationError, NotFoundError, RateLimitError, parse_event
from agentplatform_client.stream import AsyncEventStream, ReconnectPolicy, _Tracker
from websockets.asyncio.server import serve
from websockets.exceptions import ConnectionClosedError, ConnectionClosedOK
from websockets.frames import Close


def _raw(seq, type_="state.changed", data=None):
    return json.dumps({"seq": seq, "type": type_, "session": "s", "ts": None, "data": data or {}})


def test_a_replayed_seq_is_dropped_and_ephemeral_frames_pass():
    tracker = _Tracker(after=5)
    assert tracker.parse(_raw(4)) is None
    assert tracker.parse(_raw(5)) is None
    event = tracker.parse(_raw(6))
    assert event is not None and tracker.accept(event) is event and tracker.last_seq == 6
    assert tracker.accept(event) is None  # the same seq again
    delta = tracker.parse(_raw(None, "message.delta", {"text": "a", "turn": 1}))
    assert delta is not None and tracker.accept(delta) is delta and tracker.last_seq == 6


def test_a_jump_in_seq_is_a_gap():
    tracker = _Tracker(after=2)
    next_one, later = tracker.parse(_raw(3)), tracker.parse(_raw(5))
    assert next_one is not None and later is not None
    assert not tracker.missing_before(next_one)
    assert tracker.missing_before(later)


def test_a_refusal_frame_becomes_the_exception_of_the_close():
    tracker = _Tracker(after=0)
    refusal = {"code": "key_revoked", "message": "this API key has been revoked"}
    assert tracker.parse(_raw(None, "error", refusal)) is None
    error = tracker.refused(ConnectionClosedError(Close(4401, ""), None))
    assert isinstance(error, AuthenticationError)
    assert (error.code, error.message) == ("key_revoked", "this API key has been revoked")
    assert isinstance(tracker.refused(ConnectionClosedError(Close(4404, ""), None)), NotFoundError)
    assert isinstance(tracker.refused(ConnectionClosedError(Close(4429, ""), None)), RateLimitError)


def test_other_closes_reconnect():
    tracker = _Tracker(after=0)
    assert tracker.refused(ConnectionClosedError(None, None)) is None  # dropped, no close frame
    assert tracker.refused(ConnectionClosedOK(Close(1001, "going away"), None)) is None


def test_backoff_grows_to_its_cap():
    policy = ReconnectPolicy(initial_delay_s=0.2, max_delay_s=1.0)
    assert 0.1 <= policy.delay(1) <= 0.2
    assert 0.2 <= policy.delay(2) <= 0.4
    assert 0.5 <= policy.delay(10) <= 1.0


class _ScriptedServer:
    """A real websocket server on 127.0.0.1: each connection gets the next script's frames
    (seqs; None for a delta), then is cut (the client reconnects) or left open."""

    def __init__(self, scripts):
        self.scripts = list(scripts)
        self.paths: list[str] = []

    async def handler(self, ws):
        self.paths.append(ws.request.path)
        seqs, then_cut = self.scripts.pop(0)
        for seq in seqs:
            kind = "message.delta" if seq is None else "state.changed"
            await ws.send(_raw(seq, kind, {"text": "x", "turn": 1} if seq is None else {}))
        if then_cut:
            ws.transport.abort()
            return
        await ws.wait_closed()


async def _collect(server, after, count, fetch_after):
    async with serve(server.handler, "127.0.0.1", 0) as running:
        port = running.sockets[0].getsockname()[1]
        stream = AsyncEventStream(
            ws_base=f"ws://127.0.0.1:{port}",
            session_id="s1",
            api_key="k",
            after=after,
            policy=ReconnectPolicy(initial_delay_s=0.01, max_delay_s=0.05, max_attempts=5),
            fetch_after=fetch_after,
        )
        async with stream:
            return [await stream.receive(timeout=5) for _ in range(count)], stream.reconnects


async def test_a_cut_socket_resumes_after_the_last_seq_and_drops_a_replayed_overlap():
    # The second connection (as a server that lost track might) repeats 2 and 3.
    server = _ScriptedServer([([1, None, 2, 3], True), ([2, 3, 4, None, 5], False)])

    async def no_gap(after):
        raise AssertionError(f"no gap to fill, yet asked after {after}")

    events, reconnects = await _collect(server, 0, 7, no_gap)
    assert [e.seq for e in events] == [1, None, 2, 3, 4, None, 5]
    assert reconnects == 1
    assert server.paths == ["/ws/sessions/s1/?after=0", "/ws/sessions/s1/?after=3"]


async def test_a_jump_in_seq_is_filled_from_the_rest_listing_in_order():
    server = _ScriptedServer([([1, 2, 5, 6], False)])
    asked = []

    async def fetch_after(after):
        asked.append(after)
        return [parse_event(json.loads(_raw(seq))) for seq in range(after + 1, 7)]

    events, _ = await _collect(server, 0, 6, fetch_after)
    assert [e.seq for e in events] == [1, 2, 3, 4, 5, 6]
    assert asked == [2]
