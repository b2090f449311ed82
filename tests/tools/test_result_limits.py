"""Cutting a tool result to TOOL_RESULT_MAX_BYTES: whole characters, a result the engine can
store (JSON within the limit), and a marker that tells the model how much was cut."""

import hashlib
import json

import pytest
from django.test import override_settings

from tools.execution import ToolOutcome, outcome_within_limit
from tools.rendering import MAX_CHARS, render_success
from tools.result_limits import (
    CUT_KEY,
    PARTIAL_KEY,
    cut_form,
    is_cut,
    tool_result_cut,
    utf8_prefix,
)


def _size(value: object) -> int:
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())


def test_a_result_within_the_limit_is_kept_as_it_is():
    output = {"orders": [{"id": i, "name": "é" * 10} for i in range(10)]}
    assert tool_result_cut(output, limit=_size(output)) is output


def test_a_larger_result_becomes_its_cut_form_within_the_limit():
    output = {"items": [{"id": i, "text": "word " * 20} for i in range(5000)]}
    encoded = json.dumps(output, separators=(",", ":")).encode()

    cut = tool_result_cut(output, limit=10_000)

    assert is_cut(cut) and set(cut) == {CUT_KEY, PARTIAL_KEY}
    assert _size(cut) <= 10_000
    info = cut[CUT_KEY]
    assert info["original_bytes"] == len(encoded)
    assert info["sha256"] == hashlib.sha256(encoded).hexdigest()
    assert info["limit"] == 10_000
    # The partial is the start of the result's JSON text, exactly as many bytes as it says.
    assert encoded.startswith(cut[PARTIAL_KEY].encode())
    assert info["kept_bytes"] == len(cut[PARTIAL_KEY].encode()) > 8_000
    # The marker says how much was cut, of how much, and what to do about it.
    cut_bytes = len(encoded) - info["kept_bytes"]
    assert info["note"].startswith("[RESULT CUT]")
    assert f"{cut_bytes:,} of {len(encoded):,} bytes cut" in info["note"]
    assert "narrower arguments" in info["note"]
    # Stored as jsonb and read back unchanged; cutting it again changes nothing.
    assert json.loads(json.dumps(cut)) == cut
    assert tool_result_cut(cut, limit=10_000) is cut


@pytest.mark.parametrize("char", ["é", "€", "😀"])
def test_the_cut_never_splits_a_character(char):
    data = ("a" + char * 5000).encode()
    for limit in range(1, 40):
        text = utf8_prefix(data, limit)
        assert len(text.encode()) <= limit
        assert text.encode() == data[: len(text.encode())]  # a prefix, no U+FFFD
        assert "\ufffd" not in text
    cut = tool_result_cut({"text": char * 100_000}, limit=5_000)
    partial = cut[PARTIAL_KEY]
    assert partial.startswith('{"text":"' + char)
    assert partial.encode().decode() == partial and "\ufffd" not in partial


def test_escapes_do_not_push_the_cut_form_over_the_limit():
    # Every quote and control character doubles (or sextuples) once the partial is a JSON string.
    for text in ['"' * 50_000, "\x01" * 50_000, "\\" * 50_000]:
        cut = tool_result_cut({"text": text}, limit=4_000)
        assert _size(cut) <= 4_000 and cut[CUT_KEY]["kept_bytes"] > 0


def test_a_body_not_read_to_its_end_says_so():
    cut = cut_form(b'{"rows": [1, 2, 3', original_bytes=None, sha256=None, limit=2_000)
    assert cut[PARTIAL_KEY] == '{"rows": [1, 2, 3'
    assert cut[CUT_KEY]["original_bytes"] is None and cut[CUT_KEY]["sha256"] is None
    assert "more than 17 bytes" in cut[CUT_KEY]["note"]


def test_the_model_reads_the_marker_first_then_the_start_of_the_result():
    cut = tool_result_cut({"rows": ["r" * 50] * 20_000}, limit=50_000)
    content = render_success(cut)
    assert content.startswith(cut[CUT_KEY]["note"])
    assert '{"rows":["rrrr' in content
    assert len(content) <= MAX_CHARS
    assert render_success(cut, cached=True).startswith("(cached result")


@override_settings(TOOL_RESULT_MAX_BYTES=2_000)
def test_an_outcome_over_the_limit_is_cut_and_rendered_again():
    output = {"rows": list(range(5_000))}
    outcome = ToolOutcome(status="success", output=output, content=render_success(output))

    limited = outcome_within_limit(outcome)

    assert is_cut(limited.output) and _size(limited.output) <= 2_000
    assert limited.content.startswith("[RESULT CUT]")
    small = ToolOutcome(status="success", output={"ok": True}, content="ok: true")
    assert outcome_within_limit(small) is small
    # A failure keeps its message; its output (an API's error body) is cut as well.
    failed = ToolOutcome(
        status="failed", output=output, error="HTTP 400: x" * 2_000, content="[FAILED]"
    )
    limited = outcome_within_limit(failed)
    assert is_cut(limited.output) and limited.content == "[FAILED]"
    assert len(limited.error) < MAX_CHARS + 100 and "error cut" in limited.error
