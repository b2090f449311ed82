"""The stream's bookkeeping: duplicates dropped, gaps noticed, refusals raised (no socket)."""

import json

from agentplatform_client import AuthenticationError, NotFoundError, RateLimitError
from agentplatform_client.stream import ReconnectPolicy, _Tracker
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
