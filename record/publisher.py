"""Publishing session events to websocket listeners (after commit, best effort).

PostgreSQL holds every persisted event; a frame lost here only delays a client,
which fills the gap from the database by `seq`.

A frame is built once (by the step that commits it) and serialised to JSON once,
on the committing thread: the group message carries its seq and its text, and
every socket of the group forwards the text as is (500 watchers, one json.dumps).
The frames of one `publish` (a step's) travel as one group message
(`session.frames`, `[seq, text]` pairs): each listening process reads and parses
one Pub/Sub message a step instead of one a frame. Listeners read either type
with `texts_of` / `frames_of`.

Frames go through the layer's `group_send` on the process's io loop, submitted in
order from any thread (a model call's text deltas ahead of the frames its step commits).
"""

import json
import logging
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, TypedDict
from uuid import UUID

from channels.layers import get_channel_layer

from runtime import io_loop

from .events import EventType

logger = logging.getLogger(__name__)


class Frame(TypedDict):
    seq: int | None
    type: str  # an EventType (or, read back from the database, its value)
    session: str
    ts: str
    data: Mapping[str, Any]  # the type's payload (record/events.py)


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


def step_message(frames: Sequence[Frame], data_texts: Sequence[str] | None) -> dict[str, Any]:
    """One channel-layer message for several frames (a step's): `[seq, text]` pairs in order.

    Every listener of the group reads, parses and wakes once per channel-layer message,
    whatever it carries: a step's frames in one message cost that once, not per frame.
    """
    texts = data_texts if data_texts is not None else [None] * len(frames)
    return {
        "type": "session.frames",
        "frames": [
            [frame["seq"], frame_text(frame, text)]
            for frame, text in zip(frames, texts, strict=True)
        ],
    }


def texts_of(message: Mapping[str, Any]) -> list[tuple[int | None, str]]:
    """The (seq, text) of each frame a group message carries, in order (none if another type)."""
    kind = message.get("type")
    if kind == "session.frame":
        return [(message["seq"], message["text"])]
    if kind == "session.frames":
        return [(seq, text) for seq, text in message["frames"]]
    return []


def frames_of(message: Mapping[str, Any]) -> list[Frame]:
    """The frames a group message carries (for listeners that want the objects back)."""
    return [json.loads(text) for _seq, text in texts_of(message)]


async def _group_send(session_id: str, messages: list[dict[str, Any]]) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        for message in messages:
            await layer.group_send(group_name(session_id), message)
    except Exception:  # noqa: BLE001 - a lost notification must never fail a run
        logger.warning(
            "publish failed for session %s (%d frames)", session_id, len(messages), exc_info=True
        )


def publish(
    session_id: UUID | str, frames: list[Frame], data_texts: Sequence[str] | None = None
) -> None:
    """Send frames to the session's listeners without waiting; in order, from any thread.

    `data_texts`: each frame's payload as JSON text, if the caller has it (`frame_text`).
    """
    if frames:
        try:
            if len(frames) == 1:
                messages = [group_message(frames[0], data_texts[0] if data_texts else None)]
            else:
                messages = [step_message(frames, data_texts)]
        except (TypeError, ValueError):  # never fail a run over a notification
            logger.warning("unserialisable frame for session %s", session_id, exc_info=True)
            return
        io_loop.submit(_group_send(str(session_id), messages))


def publish_ephemeral(session_id: UUID | str, type_: EventType, data: Mapping[str, Any]) -> None:
    """A frame that is not persisted (`seq: null`): text deltas, progress."""
    publish(session_id, [make_frame(session_id, None, type_, data)])
