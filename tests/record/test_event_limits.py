"""Events within EVENT_MAX_BYTES: a payload too large is cut field by field when it is
written, and a frame too large to send goes out as a small one pointing to its REST page."""

import json

from django.test import override_settings

from record.event_limits import payload_capped, payload_max_bytes, pointer_text, text_within_limit
from record.events import EventSpec, EventType
from record.publisher import frame_text, make_frame

SESSION = "0b6c7c0e-3c47-4f41-9d6a-0d8e3d5f1a2b"


def _capped(data: dict) -> tuple[EventSpec, str]:
    return payload_capped(EventSpec(EventType.TOOL_FINISHED, data), json.dumps(data))


@override_settings(EVENT_MAX_BYTES=20_000)
def test_the_largest_field_is_cut_until_the_payload_fits():
    data = {
        "call_id": "call_1",
        "tool": "export",
        "status": "success",
        "error": "",
        "turn": 1,
        "output": {"rows": ["r" * 100] * 1_000},
    }
    spec, text = _capped(data)

    assert len(text) <= payload_max_bytes() and json.loads(text) == spec.data
    output_size = len(json.dumps(data["output"]))
    assert spec.data["output"] == {"truncated": True, "original_bytes": output_size}
    assert spec.data["truncated"] == {"output": output_size}
    # The rest is as it was.
    assert {k: spec.data[k] for k in ("call_id", "tool", "status", "error", "turn")} == {
        "call_id": "call_1", "tool": "export", "status": "success", "error": "", "turn": 1,
    }  # fmt: skip


@override_settings(EVENT_MAX_BYTES=20_000)
def test_a_string_keeps_its_start_and_a_list_is_emptied():
    content = "ünïcødé " * 10_000
    data = {
        "seq": 3,
        "role": "assistant",
        "content": content,
        "turn": 1,
        "tool_calls": [{"id": "x" * 30_000}],
    }
    spec, text = payload_capped(EventSpec(EventType.MESSAGE_COMPLETED, data), json.dumps(data))

    assert len(text) <= payload_max_bytes()
    kept = spec.data["content"]
    assert content.startswith(kept.split("… [cut:")[0]) and len(kept) > 1_000
    assert f"this field was {len(json.dumps(content)):,} bytes" in kept
    assert spec.data["tool_calls"] == []
    assert set(spec.data["truncated"]) == {"content", "tool_calls"}


def test_a_payload_within_the_limit_is_left_alone():
    data = {"stage": "preparing_tool", "turn": 1}
    spec = EventSpec(EventType.PROGRESS, data)
    assert payload_capped(spec, json.dumps(data)) == (spec, json.dumps(data))


@override_settings(EVENT_MAX_BYTES=10_000)
def test_a_frame_too_large_to_send_points_to_its_rest_page():
    data = {"call_id": "call_1", "tool": "export", "status": "success", "turn": 2,
            "output": {"blob": "x" * 50_000}, "error": "e" * 500}  # fmt: skip
    text = frame_text(make_frame(SESSION, 7, EventType.TOOL_FINISHED, data))

    pointer = json.loads(text_within_limit(text))

    assert (pointer["seq"], pointer["type"], pointer["session"]) == (7, "tool.finished", SESSION)
    assert pointer["data"] == {
        "call_id": "call_1", "tool": "export", "status": "success", "turn": 2,
        "truncated": {"event_bytes": len(text)},
        "url": f"/api/v1/sessions/{SESSION}/events/?after=6&limit=1",
    }  # fmt: skip
    small = frame_text(make_frame(SESSION, 8, EventType.PROGRESS, {"stage": "x", "turn": 2}))
    assert text_within_limit(small) is small
    # An ephemeral frame (no seq) has no page: it only says it was too large.
    ephemeral = json.loads(pointer_text(make_frame(SESSION, None, EventType.PROGRESS, data), 99))
    assert ephemeral["data"]["truncated"] == {"event_bytes": 99} and "url" not in ephemeral["data"]
