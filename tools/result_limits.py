"""Tool results within TOOL_RESULT_MAX_BYTES: what is kept of a larger one, and its marker.

A result is measured as its compact UTF-8 JSON. One over the limit is not stored
anywhere whole: what the call row, the tool message, the `tool.finished` event
and the model get is its cut form, an object of two keys:

    {"result_cut": {"original_bytes", "kept_bytes", "limit", "sha256", "note"},
     "partial_result": "<the start of the result's JSON text (or of an HTTP body)>"}

`note` is the marker the model reads (how much was cut, and to ask for less);
`original_bytes` and `sha256` let an operator see what came back (both None for an
HTTP body that was not read to its end: its size then comes from Content-Length,
if the server sent one). The cut form is plain JSON within the limit and valid
UTF-8 (a character is never split), so the rest of the engine handles it as any
other result.
"""

import hashlib
import json
from typing import Any

from django.conf import settings

CUT_KEY = "result_cut"
PARTIAL_KEY = "partial_result"
# The executor reads an HTTP tool's body up to the limit plus this much (a body a
# little over the limit as sent may still fit once compacted), never further.
READ_SLACK_BYTES = 64 * 1024


def result_max_bytes() -> int:
    return int(settings.TOOL_RESULT_MAX_BYTES)


def http_read_limit() -> int:
    """How many bytes of an HTTP tool's body are read at most."""
    return result_max_bytes() + READ_SLACK_BYTES


def utf8_prefix(data: bytes, max_bytes: int) -> str:
    """At most `max_bytes` of `data` as text, never ending inside a UTF-8 sequence.

    Bytes that are not UTF-8 at all (a body in another charset) become U+FFFD.
    """
    if len(data) <= max_bytes:
        return data.decode("utf-8", errors="replace")
    end = max(max_bytes, 0)
    # Back off over continuation bytes (10xxxxxx) to the start of the cut character.
    while end > 0 and data[end] & 0xC0 == 0x80:
        end -= 1
    return data[:end].decode("utf-8", errors="replace")


def _encoded(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str).encode(
        "utf-8", errors="surrogatepass"
    )


def is_cut(output: Any) -> bool:
    """Whether `output` is the cut form of a result (made here)."""
    return (
        isinstance(output, dict)
        and set(output) == {CUT_KEY, PARTIAL_KEY}
        and isinstance(output[CUT_KEY], dict)
        and isinstance(output[PARTIAL_KEY], str)
    )


def cut_note(*, original_bytes: int | None, kept_bytes: int, limit: int) -> str:
    """The marker the model reads: how much was cut, and what to do about it."""
    if original_bytes is None:
        size = f"more than {kept_bytes:,} bytes"
        cut = "the rest was not read"
    else:
        size = f"{original_bytes:,} bytes"
        cut = f"{original_bytes - kept_bytes:,} of {original_bytes:,} bytes cut"
    return (
        f"[RESULT CUT] This result was {size}, over the {limit:,}-byte limit for a tool "
        f"result: only its first {kept_bytes:,} bytes are kept ({cut}), so it ends mid-value. "
        "If you need what is missing, call the tool again asking for less: narrower arguments "
        "(a filter, fewer fields, a smaller page or date range)."
    )


def cut_form(
    data: bytes,
    *,
    original_bytes: int | None,
    sha256: str | None,
    limit: int | None = None,
) -> dict[str, Any]:
    """The cut form of a result whose JSON text (or body) starts with `data`.

    1. Measure the form with an empty partial: the room left is for the partial.
    2. Take that many bytes of `data` (whole characters only).
    3. JSON escaping can make the partial longer than its bytes (quotes,
       backslashes, control characters): shrink it until the form fits.
    """
    limit = result_max_bytes() if limit is None else limit

    def form(partial: str) -> dict[str, Any]:
        kept = len(partial.encode("utf-8", errors="surrogatepass"))
        return {
            CUT_KEY: {
                "original_bytes": original_bytes,
                "kept_bytes": kept,
                "limit": limit,
                "sha256": sha256,
                "note": cut_note(original_bytes=original_bytes, kept_bytes=kept, limit=limit),
            },
            PARTIAL_KEY: partial,
        }

    # Room for the digits of kept_bytes growing from "0", with a margin.
    room = max(limit - len(_encoded(form(""))) - 32, 0)
    take = room
    while True:
        partial = utf8_prefix(data, take)
        result = form(partial)
        size = len(_encoded(result))
        if size <= limit or take == 0:
            return result
        # Escapes grew it: shrink in proportion to the overshoot, at least one byte.
        take = max(min(take - 1, int(take * room / max(size, 1)) - 8), 0)


def tool_result_cut(output: dict[str, Any], *, limit: int | None = None) -> dict[str, Any]:
    """`output` itself when its compact JSON is within the limit, else its cut form."""
    if is_cut(output):
        return output
    limit = result_max_bytes() if limit is None else limit
    encoded = _encoded(output)
    if len(encoded) <= limit:
        return output
    return cut_form(
        encoded,
        original_bytes=len(encoded),
        sha256=hashlib.sha256(encoded).hexdigest(),
        limit=limit,
    )


def text_cut(text: str, max_chars: int, what: str = "text") -> str:
    """`text` at most `max_chars` long, with a marker saying how much was cut."""
    if len(text) <= max_chars:
        return text
    return text[:max_chars] + f"… [{what} cut: {len(text) - max_chars:,} more characters]"
