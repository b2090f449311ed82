"""The HTTP plumbing under the adapters: the SSE parser, Retry-After, secret redaction, the timeouts."""

import email.utils
import json
import time
from collections.abc import AsyncIterator

import pytest

from llm.base import ModelTimeout, ModelUnavailable, adapter_for
from llm.http import (
    header_secrets,
    json_value,
    parse_retry_after,
    redact,
    sse_batches,
)
from llm.types import ChatMessage, ChatRequest
from tests.fakes.model_servers import Reply

HELLO = ChatRequest(messages=(ChatMessage(role="user", content="hi"),))


async def chunks_of(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


async def parse(*parts: bytes) -> list[tuple[str, str]]:
    return [event async for batch in sse_batches(chunks_of(*parts)) for event in batch]


async def test_events_split_anywhere_across_chunks():
    wire = b'event: message_start\ndata: {"a": 1}\n\ndata: {"b": 2}\n\n'
    expected = [("message_start", '{"a": 1}'), ("message", '{"b": 2}')]
    for size in range(1, len(wire) + 1):
        pieces = [wire[i : i + size] for i in range(0, len(wire), size)]
        assert await parse(*pieces) == expected, size


async def test_a_utf8_character_split_at_every_byte_offset_is_reassembled():
    wire = 'data: {"t": "Grüße 您好 📦"}\n\n'.encode()
    for cut in range(len(wire)):
        assert await parse(wire[:cut], wire[cut:]) == [("message", '{"t": "Grüße 您好 📦"}')], cut
    # One byte per chunk: every multi-byte character arrives in pieces.
    assert await parse(*[wire[i : i + 1] for i in range(len(wire))]) == [
        ("message", '{"t": "Grüße 您好 📦"}')
    ]


async def test_invalid_utf8_becomes_replacement_characters_instead_of_failing():
    assert await parse(b"data: ok \xff\xfe end\n\n", b"data: next\n\n") == [
        ("message", "ok \ufffd\ufffd end"),
        ("message", "next"),
    ]
    # A multi-byte sequence cut off by the end of the stream.
    assert await parse(b"data: cut \xf0\x9f") == [("message", "cut \ufffd")]


async def test_crlf_comments_multiline_data_and_field_without_space():
    wire = b": keep-alive\r\n\r\nevent:ping\r\ndata:{}\r\n\r\ndata: line one\ndata: line two\n\nid: 7\nretry: 100\ndata: x\n\n"
    assert await parse(wire) == [
        ("ping", "{}"),
        ("message", "line one\nline two"),
        ("message", "x"),
    ]


async def test_blank_lines_and_an_event_name_without_data_dispatch_nothing():
    assert await parse(b"\n\n\nevent: lonely\n\ndata: real\n\n") == [("message", "real")]


async def test_a_last_event_without_the_blank_line_is_still_delivered():
    assert await parse(b"data: one\n\ndata: [DONE]") == [("message", "one"), ("message", "[DONE]")]


async def test_the_events_of_one_network_read_come_as_one_batch():
    batches = [
        batch
        async for batch in sse_batches(
            chunks_of(b"data: a\n\nevent: e\ndata: b\n\nda", b"ta: c\n\n", b"data: d")
        )
    ]
    assert batches == [[("message", "a"), ("e", "b")], [("message", "c")], [("message", "d")]]


async def test_crlf_and_lf_streams_mixed_and_split_anywhere():
    # The parser switches between its block fast path and the line-by-line one
    # (CRLF, comments, multi-line data); the events must not depend on where reads end.
    wire = (
        b'data: {"a": 1}\n\n'
        b"event: e1\r\ndata: x\r\n\r\n"
        b"event: e2\ndata: y\n\n"
        b": note\ndata: p\ndata: q\n\n"
        b"event: \ndata: z\n\n"
        b"\n\nid: 1\ndata:  spaced\n\n"
        b"data: last\r\n\r\n"
        b"data: end"
    )
    expected = [
        ("message", '{"a": 1}'),
        ("e1", "x"),
        ("e2", "y"),
        ("message", "p\nq"),
        ("message", "z"),
        ("message", " spaced"),
        ("message", "last"),
        ("message", "end"),
    ]
    for cut in range(len(wire) + 1):
        assert await parse(wire[:cut], wire[cut:]) == expected, cut
    for size in (1, 2, 3, 5, 7, 11):
        pieces = [wire[i : i + size] for i in range(0, len(wire), size)]
        assert await parse(*pieces) == expected, size


@pytest.mark.parametrize(
    "text",
    ['{"a": [1, 2.5, "x"]}', ' {"a": 1}', '{"a": 1}\n ', '"s"', "NaN", "[]", "-0"],
)
def test_json_value_parses_what_json_loads_parses(text):
    assert repr(json_value(text)) == repr(json.loads(text))  # repr: NaN != NaN


@pytest.mark.parametrize("text", ["", "  ", '{"a": 1} x', '{"a":', "{'a': 1}", "[1,]", "[DONE]"])
def test_json_value_refuses_what_json_loads_refuses(text):
    with pytest.raises(ValueError) as expected:
        json.loads(text)
    with pytest.raises(ValueError) as caught:
        json_value(text)
    assert str(caught.value) == str(expected.value)


async def test_a_stream_written_one_byte_at_a_time_over_a_real_socket(openai_server, endpoint_for):
    openai_server.script(Reply(text="Grüße 📦 ok", text_splits=2, write_size=1, write_pause_s=0.0))
    response = await adapter_for(endpoint_for(openai_server)).complete(HELLO)
    assert response.text == "Grüße 📦 ok"


# Retry-After ---------------------------------------------------------------------------


def test_retry_after_seconds_dates_and_junk():
    assert parse_retry_after("2") == 2.0
    assert parse_retry_after("0.5") == 0.5
    assert parse_retry_after("-3") == 0.0
    assert parse_retry_after("100000") == 60.0  # capped
    assert parse_retry_after(None) is None and parse_retry_after("") is None
    assert parse_retry_after("soon") is None
    assert parse_retry_after("nan") is None
    assert parse_retry_after("Mon, 99 Foo 2024 99:99:99 GMT") is None
    in_ten = email.utils.formatdate(time.time() + 10, usegmt=True)
    assert 8 <= (parse_retry_after(in_ten) or 0) <= 10
    naive = email.utils.formatdate(time.time() + 10, usegmt=True).replace(" GMT", "")
    assert 8 <= (parse_retry_after(naive) or 0) <= 10
    assert parse_retry_after(email.utils.formatdate(time.time() - 100, usegmt=True)) == 0.0


# Secrets -------------------------------------------------------------------------------


def test_redact_and_header_secrets():
    secrets = header_secrets(
        {"Authorization": "Bearer sk-live-123456", "x-api-key": "ak-987654", "Accept": "text/plain"}
    )
    assert "sk-live-123456" in secrets and "ak-987654" in secrets and "text/plain" not in secrets
    text = "bad key sk-live-123456 / Bearer sk-live-123456 / ak-987654"
    cleaned = redact(text, secrets)
    assert (
        "sk-live-123456" not in cleaned and "ak-987654" not in cleaned and "[redacted]" in cleaned
    )
    assert redact("abc", ["", "ab"]) == "abc"  # empty or tiny values are not treated as secrets


# Timeouts ------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "non-streamed"])
async def test_the_first_token_timeout_counts_from_the_request(openai_server, endpoint_for, stream):
    openai_server.script(Reply(text="late", first_delay_s=1.0))
    adapter = adapter_for(endpoint_for(openai_server, first_token_timeout_s=0.4))
    started = time.monotonic()
    with pytest.raises(Exception) as caught:
        await (adapter.complete(HELLO) if stream else adapter.respond(HELLO))
    assert type(caught.value).__name__ == "ModelTimeout"
    assert time.monotonic() - started < 0.9


async def test_a_first_token_inside_the_timeout_is_fine_even_if_the_whole_answer_is_longer(
    openai_server, endpoint_for
):
    openai_server.script(Reply(text="a b c d e f g h", delay_s=0.08))
    adapter = adapter_for(endpoint_for(openai_server, first_token_timeout_s=0.3, total_timeout_s=3))
    assert (await adapter.complete(HELLO)).text == "a b c d e f g h"


async def test_the_connect_timeout(endpoint_for, openai_server, unreachable_url):
    config = endpoint_for(openai_server, connect_timeout_s=0.3, first_token_timeout_s=5)
    adapter = adapter_for(type(config)(**{**config.__dict__, "base_url": unreachable_url}))
    started = time.monotonic()
    with pytest.raises(ModelTimeout) as caught:
        await adapter.complete(HELLO)
    assert time.monotonic() - started < 1.5
    assert "could not connect" in str(caught.value) and "0.3 s" in str(caught.value)


async def test_a_connection_closed_before_any_answer_is_unavailable(openai_server, endpoint_for):
    openai_server.script(Reply(drop=True))
    with pytest.raises(ModelUnavailable):
        await adapter_for(endpoint_for(openai_server)).complete(HELLO)
