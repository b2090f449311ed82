"""record/publisher.py: a step's frames reach the group's listeners in order, in one
group message, through the channel layer on the io loop."""

import asyncio
import json
import uuid
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from channels_redis.pubsub import RedisPubSubLoopLayer

from record import publisher
from record.events import EventType
from runtime import io_loop


async def _frames_of(layer: Any, channel: str, count: int) -> tuple[list[dict[str, Any]], int]:
    """`count` frames from the channel, and how many group messages carried them."""
    frames: list[dict[str, Any]] = []
    messages = 0
    while len(frames) < count:
        message = await asyncio.wait_for(layer.receive(channel), 5)
        messages += 1
        frames += [dict(f) for f in publisher.frames_of(message)]
    return frames, messages


def _received_messages(session_id: str, count: int) -> tuple[list[dict[str, Any]], int]:
    async def listen() -> tuple[list[dict[str, Any]], int]:
        layer = get_channel_layer()
        channel = await layer.new_channel()
        await layer.group_add(publisher.group_name(session_id), channel)
        try:
            publisher.publish(session_id, [_frame(session_id, n) for n in range(1, count + 1)])
            return await _frames_of(layer, channel, count)
        finally:
            await layer.group_discard(publisher.group_name(session_id), channel)

    return async_to_sync(listen)()


def _received(session_id: str, count: int) -> list[dict[str, Any]]:
    return _received_messages(session_id, count)[0]


def _frame(session_id: str, seq: int) -> publisher.Frame:
    return publisher.make_frame(session_id, seq, EventType.PROGRESS, {"stage": f"s{seq}"})


@pytest.fixture
def group_sends(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The groups `group_send` was called for (the io loop's path, one round trip a frame)."""
    sent: list[str] = []
    original = RedisPubSubLoopLayer.group_send

    async def group_send(self: Any, group: str, message: dict[str, Any]) -> None:
        sent.append(group)
        await original(self, group, message)

    monkeypatch.setattr(RedisPubSubLoopLayer, "group_send", group_send)
    return sent


@pytest.mark.parametrize("count", [6, 1])
def test_frames_arrive_in_order_in_one_group_message(group_sends: list[str], count: int) -> None:
    session_id = str(uuid.uuid4())

    frames, messages = _received_messages(session_id, count)

    assert messages == 1  # a step's frames travel together: one Pub/Sub message to read
    assert [f["seq"] for f in frames] == list(range(1, count + 1))
    assert [f["data"]["stage"] for f in frames] == [f"s{n}" for n in range(1, count + 1)]
    assert group_sends == [publisher.group_name(session_id)]  # one group_send for them all


def test_deltas_from_the_io_loop_stay_ahead_of_the_frames_a_thread_publishes_next() -> None:
    """A model call's text deltas (published on the io loop) reach a listener before the
    frames its step commits on the worker's thread."""
    session_id = str(uuid.uuid4())

    async def stream() -> None:
        for n in range(30):
            publisher.publish_ephemeral(session_id, EventType.MESSAGE_DELTA, {"text": f"t{n}"})

    async def listen() -> list[dict[str, Any]]:
        layer = get_channel_layer()
        channel = await layer.new_channel()
        await layer.group_add(publisher.group_name(session_id), channel)
        try:
            await asyncio.wrap_future(io_loop.submit(stream()))
            publisher.publish(session_id, [_frame(session_id, 1), _frame(session_id, 2)])
            return (await _frames_of(layer, channel, 32))[0]
        finally:
            await layer.group_discard(publisher.group_name(session_id), channel)

    frames = async_to_sync(listen)()

    assert [f["data"].get("text") for f in frames[:30]] == [f"t{n}" for n in range(30)]
    assert [f["seq"] for f in frames[30:]] == [1, 2]


@pytest.mark.parametrize(
    "data",
    [
        {"stage": "s1"},
        {"content": 'it\'s \\ "quoted" ünïcødé ✓ \u2028 </script>', "n": [1, 2.5, None, True]},
        {},
    ],
)
@pytest.mark.parametrize("seq", [7, None])
def test_a_frame_with_its_payload_text_is_the_same_text(data: dict[str, Any], seq: Any) -> None:
    """The step commit hands over each payload's JSON text (made for the event's row):
    the frame's text is what dumping the whole frame gives."""
    frame = publisher.make_frame(str(uuid.uuid4()), seq, EventType.MESSAGE_COMPLETED, data)

    assert publisher.frame_text(frame, json.dumps(data)) == json.dumps(frame)
    assert publisher.group_message(frame, json.dumps(data)) == publisher.group_message(frame)
