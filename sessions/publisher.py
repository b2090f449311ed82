"""Publishing session events to websocket listeners (after commit, best effort).

PostgreSQL holds every persisted event; a frame lost here only delays a client,
which fills the gap from the database by `seq`.

A frame is built once (by the step that commits it) and serialised to JSON once,
on the committing thread: the group message carries its seq and its text, and
every socket of the group forwards the text as is (500 watchers, one json.dumps).
"""

import json
import logging
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, TypedDict
from uuid import UUID

from channels.layers import get_channel_layer
from channels_redis.pubsub import RedisPubSubChannelLayer

from runtime import io_loop

from .events import EventType

logger = logging.getLogger(__name__)


class Frame(TypedDict):
    seq: int | None
    type: str  # an EventType (or, read back from the database, its value)
    session: str
    ts: str
    data: Mapping[str, Any]  # the type's payload (sessions/events.py)


def group_name(session_id: UUID | str) -> str:
    return f"session.{session_id}"


def make_frame(
    session_id: UUID | str,
    seq: int | None,
    type_: EventType | str,
    data: Mapping[str, Any],
    ts: datetime | None = None,
) -> Frame:
    return {
        "seq": seq,
        "type": type_,
        "session": str(session_id),
        # The same form as the REST API's timestamps (DRF writes UTC as "Z").
        "ts": (ts or datetime.now(UTC)).isoformat().replace("+00:00", "Z"),
        "data": data,
    }


def frame_text(frame: Frame, data_text: str | None = None) -> str:
    """The JSON text of a frame, as a websocket sends it.

    `data_text`: `json.dumps(frame["data"])`, already made (the step commit
    made it for the event's row): spliced in rather than dumped again. The
    text is the same either way (the payload is the frame's last key, as
    `make_frame` builds it).
    """
    if data_text is None:
        return json.dumps(frame)
    head = json.dumps(
        {"seq": frame["seq"], "type": frame["type"], "session": frame["session"], "ts": frame["ts"]}
    )
    return f'{head[:-1]}, "data": {data_text}}}'


def group_message(frame: Frame, data_text: str | None = None) -> dict[str, Any]:
    """The channel-layer message of a frame: its seq (for gap detection) and its text."""
    return {"type": "session.frame", "seq": frame["seq"], "text": frame_text(frame, data_text)}


def frame_of(message: Mapping[str, Any]) -> Frame:
    """The frame a group message carries (for listeners that want the object back)."""
    frame: Frame = json.loads(message["text"])
    return frame


async def _publish_pipelined(layer: Any, group: str, messages: list[dict[str, Any]]) -> bool:
    """All of a step's frames in one Redis round trip, on the Pub/Sub layer; False
    (nothing sent) where the layer is another kind.

    `group_send` costs a round trip per frame (~70 µs of the loop's CPU each,
    ~7 frames a tool iteration). The same PUBLISH commands, in order, under
    the shard's own lock, so they stay in order with every other send.
    """
    if not isinstance(layer, RedisPubSubChannelLayer):
        return False
    try:
        # channels_redis 4.2-4.3 internals: another release without them falls back to
        # group_send (one round trip per frame) rather than losing frames.
        loop_layer = layer._get_layer()
        channel = loop_layer._get_group_channel_name(group)
        shard = loop_layer._get_shard(channel)
        shard._lock, shard._ensure_redis  # noqa: B018 - probe before anything is sent
    except AttributeError:
        return False
    payloads = [layer.serialize(message) for message in messages]
    async with shard._lock:
        shard._ensure_redis()
        async with shard._redis.pipeline(transaction=False) as pipe:
            for payload in payloads:
                pipe.publish(channel, payload)
            await pipe.execute()
    return True


async def _send(session_id: str, messages: list[dict[str, Any]]) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        group = group_name(session_id)
        if len(messages) > 1 and await _publish_pipelined(layer, group, messages):
            return
        for message in messages:
            await layer.group_send(group, message)
    except Exception:  # noqa: BLE001 - a lost notification must never fail a run
        logger.warning(
            "publish failed for session %s (%d frames)", session_id, len(messages), exc_info=True
        )


def publish(
    session_id: UUID | str, frames: list[Frame], data_texts: Sequence[str] | None = None
) -> None:
    """Hand frames to the shared loop without waiting; order is kept per call.

    `data_texts`: each frame's payload as JSON text, if the caller has it (`frame_text`).
    """
    if frames:
        try:
            if data_texts is None:
                messages = [group_message(frame) for frame in frames]
            else:
                messages = [
                    group_message(frame, text)
                    for frame, text in zip(frames, data_texts, strict=True)
                ]
        except (TypeError, ValueError):  # never fail a run over a notification
            logger.warning("unserialisable frame for session %s", session_id, exc_info=True)
            return
        io_loop.submit(_send(str(session_id), messages))


def publish_ephemeral(session_id: UUID | str, type_: EventType, data: Mapping[str, Any]) -> None:
    """A frame that is not persisted (`seq: null`): text deltas, progress."""
    publish(session_id, [make_frame(session_id, None, type_, data)])
