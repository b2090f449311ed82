"""Events within EVENT_MAX_BYTES, so none can break the websocket.

daphne's websocket (autobahn) refuses to send a message over 1 MiB: it raises
inside the consumer, which closes the socket with 1011, and every replay through
that event failed the same way. So:

- when a step writes an event whose payload is too large, fields are cut until it
  fits (`payload_capped`): a string keeps its start and a marker, a list becomes
  empty, any other value becomes `{"truncated": true, "original_bytes": N}`, and
  the payload's `truncated` names each cut field with its original size;
- an event stored before this limit (or any frame still too large) goes out as a
  small frame instead (`pointer_text`): its seq, type and small fields, with
  `truncated: {"event_bytes": N}` and `url`, the REST page that holds it whole.

Sizes are of `json.dumps` text (ASCII: one byte a character), as the row's
payload and the websocket frame are written.
"""

import json
from collections.abc import Mapping
from typing import Any, cast

from django.conf import settings

from .events import EventSpec, Payload

# Room for the frame's envelope (seq, type, session id, timestamp) and the `truncated` note.
ENVELOPE_BYTES = 1024
STRING_MARKER = "… [cut: this field was {size:,} bytes; an event is at most {limit:,}]"
# A field of a pointer frame is kept when it is a number, a bool, null or a string this short.
POINTER_FIELD_CHARS = 200


def event_max_bytes() -> int:
    return int(settings.EVENT_MAX_BYTES)


def payload_max_bytes() -> int:
    return max(event_max_bytes() - ENVELOPE_BYTES, 0)


def _string_cut(value: str, size: int, target: int, limit: int) -> str:
    """The start of `value` and a marker, its JSON at most `target` bytes."""
    marker = STRING_MARKER.format(size=size, limit=limit)
    room = target - len(json.dumps(marker))
    keep = max(int(len(value) * room / max(size, 1)), 0)
    while True:
        cut = value[:keep] + marker
        if len(json.dumps(cut)) <= target or keep == 0:
            return cut
        keep = int(keep * 0.9)


def payload_capped(spec: EventSpec, text: str) -> tuple[EventSpec, str]:
    """The event with its payload within `payload_max_bytes()`, and the payload's JSON.

    1. Measure each field of the payload.
    2. Cut fields until the payload fits: lists and objects first, largest first,
       then strings (each to what still fits, with its marker).
    3. Name the cut fields and their sizes in `truncated`.
    """
    limit = payload_max_bytes()
    if len(text) <= limit:
        return spec, text
    data: dict[str, Any] = dict(spec.data)
    sizes = {key: len(json.dumps(value)) for key, value in data.items()}
    cut: dict[str, int] = {}
    total = len(text)
    # Structures go first, largest first (they are replaced whole); strings last, as
    # the start of one is still worth having.
    # (Numbers, booleans and null are never large: they stay.)
    order = sorted(
        (k for k in sizes if isinstance(data[k], str | list | dict)),
        key=lambda k: (isinstance(data[k], str), -sizes[k]),
    )
    for key in order:
        # The note names the cut fields: room for it as well.
        if total + len(json.dumps({"truncated": cut})) <= limit:
            break
        excess = total + len(json.dumps({"truncated": {**cut, key: sizes[key]}})) - limit
        value = data[key]
        if isinstance(value, str):
            data[key] = _string_cut(value, sizes[key], max(sizes[key] - excess, 0), limit)
        elif isinstance(value, list):
            data[key] = []
        else:  # an object
            data[key] = {"truncated": True, "original_bytes": sizes[key]}
        cut[key] = sizes[key]
        total += len(json.dumps(data[key])) - sizes[key]
    data["truncated"] = cut
    return EventSpec(spec.type, cast(Payload, data)), json.dumps(data)


def events_url(session_id: str, seq: int) -> str:
    """The REST page whose only event is `seq` (a page holds at least one event, whatever its size)."""
    return f"/api/v1/sessions/{session_id}/events/?after={seq - 1}&limit=1"


def pointer_text(frame: Mapping[str, Any], size: int) -> str:
    """A small frame standing for one too large to send: where to read it instead."""
    data = frame.get("data")
    kept: dict[str, Any] = {
        key: value
        for key, value in (data.items() if isinstance(data, Mapping) else ())
        if key != "truncated"
        and (
            value is None
            or isinstance(value, bool | int | float)
            or (isinstance(value, str) and len(value) <= POINTER_FIELD_CHARS)
        )
    }
    kept["truncated"] = {"event_bytes": size}
    seq = frame.get("seq")
    if isinstance(seq, int):
        kept["url"] = events_url(str(frame.get("session", "")), seq)
    return json.dumps({**frame, "data": kept})


def text_within_limit(text: str) -> str:
    """A frame's text as is, or its pointer frame when it is over EVENT_MAX_BYTES."""
    if len(text) <= event_max_bytes():
        return text
    size = len(text.encode())
    if size <= event_max_bytes():
        return text
    return pointer_text(json.loads(text), size)
