"""sessions/publisher.py: a step's frames reach the group's listeners in order,
sent in one Redis round trip on the Pub/Sub layer."""

import asyncio
import json
import uuid
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from channels_redis.pubsub import RedisPubSubLoopLayer

from sessions import publisher
from sessions.events import EventType


def _received(session_id: str, count: int) -> list[dict[str, Any]]:
    async def listen() -> list[dict[str, Any]]:
        layer = get_channel_layer()
        channel = await layer.new_channel()
        await layer.group_add(publisher.group_name(session_id), channel)
        try:
            publisher.publish(session_id, [_frame(session_id, n) for n in range(1, count + 1)])
            return [
                dict(publisher.frame_of(await asyncio.wait_for(layer.receive(channel), 5)))
                for _ in range(count)
            ]
        finally:
            await layer.group_discard(publisher.group_name(session_id), channel)

    return async_to_sync(listen)()


def _frame(session_id: str, seq: int) -> publisher.Frame:
    return publisher.make_frame(session_id, seq, EventType.PROGRESS, {"stage": f"s{seq}"})


def test_a_steps_frames_arrive_in_order_in_one_round_trip(monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[str] = []
    original = RedisPubSubLoopLayer.group_send

    async def group_send(self: Any, group: str, message: dict[str, Any]) -> None:
        sent.append(group)
        await original(self, group, message)

    monkeypatch.setattr(RedisPubSubLoopLayer, "group_send", group_send)
    session_id = str(uuid.uuid4())

    frames = _received(session_id, 6)

    assert [f["seq"] for f in frames] == [1, 2, 3, 4, 5, 6]
    assert [f["data"]["stage"] for f in frames] == [f"s{n}" for n in range(1, 7)]
    assert sent == []  # no group_send per frame: one pipeline


def test_a_single_frame_goes_by_group_send(monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[str] = []
    original = RedisPubSubLoopLayer.group_send

    async def group_send(self: Any, group: str, message: dict[str, Any]) -> None:
        sent.append(group)
        await original(self, group, message)

    monkeypatch.setattr(RedisPubSubLoopLayer, "group_send", group_send)
    session_id = str(uuid.uuid4())

    assert [f["seq"] for f in _received(session_id, 1)] == [1]
    assert sent == [publisher.group_name(session_id)]


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
