"""The Anthropic Messages adapter against a real (fake) HTTP server speaking the wire format."""

import time
from typing import Any

import pytest

from llm.anthropic import API_VERSION, DEFAULT_MAX_TOKENS
from llm.base import (
    ModelConfigError,
    ModelError,
    ModelProtocolError,
    ModelRateLimited,
    ModelTimeout,
    ModelUnavailable,
    adapter_for,
)
from llm.types import (
    ChatMessage,
    ChatRequest,
    Finish,
    ResponseFormat,
    StreamEvent,
    TextDelta,
    ToolCallArgumentsDelta,
    ToolCallFinished,
    ToolCallRequest,
    ToolCallStarted,
    ToolSpec,
    Usage,
)
from tests.fakes.model_servers import Call, Reply, invalid_utf8_event, sse

from .conftest import KEY

HELLO = ChatRequest(
    messages=(
        ChatMessage(role="system", content="Be brief."),
        ChatMessage(role="user", content="hi"),
    )
)
ORDERS_TOOL = ToolSpec(
    name="query_orders",
    description="Find orders.",
    parameters={
        "type": "object",
        "properties": {"days": {"type": "integer"}},
        "required": ["days"],
    },
)

NOTIFY_TOOL = ToolSpec(
    name="send_notification",
    description="Notify a customer.",
    parameters={"type": "object", "properties": {"message": {"type": "string"}}},
)
# A request offering the tools the scripts call (the strict fake server refuses any other).
ASK_ORDERS = ChatRequest(messages=HELLO.messages, tools=(ORDERS_TOOL, NOTIFY_TOOL))


async def collect(adapter: Any, request: ChatRequest = HELLO) -> list[StreamEvent]:
    return [event async for event in adapter.stream(request)]


async def test_streamed_text_with_usage_from_message_start_and_message_delta(
    anthropic_server, endpoint_for
):
    anthropic_server.script(Reply(text="Hello from the messages API.", usage=(33, 9)))
    events = await collect(adapter_for(endpoint_for(anthropic_server)))
    deltas = [e.text for e in events if isinstance(e, TextDelta)]
    assert len(deltas) > 1 and "".join(deltas) == "Hello from the messages API."
    assert events[-2:] == [Usage(33, 9), Finish("stop")]


async def test_unknown_events_blocks_and_pings_are_ignored(anthropic_server, endpoint_for):
    # A `mystery` content block with `mystery_delta`s, a `brand_new_event` and pings between deltas.
    anthropic_server.script(
        Reply(text="still fine", unknown_events=True, calls=[Call("query_orders", {"days": 2})])
    )
    response = await adapter_for(endpoint_for(anthropic_server)).complete(ASK_ORDERS)
    assert response.text == "still fine"
    assert [c.arguments for c in response.tool_calls] == [{"days": 2}]
    assert anthropic_server.requests[0].stream


async def test_a_text_delta_named_only_by_its_sse_event_line_is_still_text(
    anthropic_server, endpoint_for
):
    # Plain text deltas take a short path keyed on the body's `type`; without one,
    # the SSE `event:` line names the event, as before.
    untyped = sse(
        {"index": 0, "delta": {"type": "text_delta", "text": " more"}}, "content_block_delta"
    )
    anthropic_server.script(Reply(text="hello", insert=[(4, untyped)]))
    response = await adapter_for(endpoint_for(anthropic_server)).complete(HELLO)
    assert response.text == "hello more"


async def test_non_streamed_text_and_tool_use_with_respond(anthropic_server, endpoint_for):
    anthropic_server.script(
        Reply(
            text="Checking.",
            calls=[Call("query_orders", {"days": 7}, id="toolu_1")],
            usage=(12, 30),
        )
    )
    response = await adapter_for(endpoint_for(anthropic_server)).respond(ASK_ORDERS)
    assert response.text == "Checking."
    assert response.tool_calls == [
        ToolCallRequest(id="toolu_1", name="query_orders", arguments={"days": 7})
    ]
    assert (response.usage, response.finish_reason) == (Usage(12, 30), "tool_calls")
    assert "stream" not in anthropic_server.requests[0].body


async def test_non_streamed_tool_input_that_is_not_an_object_is_reported(
    anthropic_server, endpoint_for
):
    anthropic_server.script(Reply(calls=[Call("query_orders", "{broken")]))
    response = await adapter_for(endpoint_for(anthropic_server)).respond(ASK_ORDERS)
    assert response.tool_calls[0].arguments == {} and response.tool_calls[0].arguments_error


async def test_tool_use_blocks_with_partial_json_split_mid_token_and_mid_utf8(
    anthropic_server, endpoint_for
):
    calls = [
        Call(
            "send_notification",
            {"customer_id": 7, "message": "Grüße — 您的包裹 📦"},
            id="toolu_a",
            splits=[1, 5, 14, 30],
        ),
        Call("query_orders", {"days": 7}, id="toolu_b", splits=3),
    ]
    anthropic_server.script(
        Reply(
            text="On it.",
            calls=calls,
            write_size=9,
            split_multibyte=True,
            write_pause_s=0.0005,
            usage=(50, 70),
        )
    )
    events = await collect(adapter_for(endpoint_for(anthropic_server)), ASK_ORDERS)

    started = [e for e in events if isinstance(e, ToolCallStarted)]
    assert [(e.id, e.name) for e in started] == [
        ("toolu_a", "send_notification"),
        ("toolu_b", "query_orders"),
    ]
    fragments = [
        e.fragment
        for e in events
        if isinstance(e, ToolCallArgumentsDelta) and e.index == started[0].index
    ]
    text = calls[0].arguments_text()
    assert fragments == [text[:1], text[1:5], text[5:14], text[14:30], text[30:]]
    finished = [e.call for e in events if isinstance(e, ToolCallFinished)]
    assert [c.arguments for c in finished] == [calls[0].arguments, calls[1].arguments]
    assert events[-2:] == [Usage(50, 70), Finish("tool_calls")]


async def test_tool_input_that_is_not_json_is_reported_for_the_tool_layer(
    anthropic_server, endpoint_for
):
    anthropic_server.script(Reply(calls=[Call("query_orders", '{"days": ')]))
    response = await adapter_for(endpoint_for(anthropic_server)).complete(ASK_ORDERS)
    assert response.tool_calls[0].arguments == {} and response.tool_calls[0].arguments_error


async def test_sampling_on_the_wire_and_what_it_has_no_field_for(anthropic_server, endpoint_for):
    """Anthropic has stop sequences and top_p, no seed and no structured output: the engine
    asks for JSON in words and checks the answer (engine/model/structured.py)."""
    anthropic_server.script(Reply(text="{}"))
    await adapter_for(endpoint_for(anthropic_server)).complete(
        ChatRequest(
            messages=(ChatMessage(role="user", content="hi"),),
            top_p=0.5,
            stop=("END",),
            seed=42,
            max_tokens=99,
            response_format=ResponseFormat(schema={"type": "object"}),
        )
    )
    body = anthropic_server.requests[0].body
    assert (body["top_p"], body["stop_sequences"], body["max_tokens"]) == (0.5, ["END"], 99)
    assert not {"seed", "response_format", "output_format"} & set(body)


async def test_request_payload_and_headers(anthropic_server, endpoint_for):
    history = (
        ChatMessage(role="system", content="You are helpful."),
        ChatMessage(role="user", content="find orders"),
        ChatMessage(
            role="assistant",
            content="Looking.",
            tool_calls=(
                ToolCallRequest(id="toolu_1", name="query_orders", arguments={"days": 7}),
                ToolCallRequest(id="toolu_2", name="query_orders", arguments={"days": 30}),
            ),
        ),
        ChatMessage(
            role="tool",
            content='{"count": 0}',
            tool_call_id="toolu_1",
            name="query_orders",
            data={"count": 0},
        ),
        ChatMessage(
            role="tool",
            content="failed",
            tool_call_id="toolu_2",
            name="query_orders",
            data={"status": "failed", "error": "x"},
        ),
        ChatMessage(role="system", content="Answer now."),
    )
    request = ChatRequest(
        messages=history, tools=(ORDERS_TOOL,), tool_choice="required", temperature=0.5
    )
    anthropic_server.script(Reply(calls=[Call("query_orders", {"days": 1})]))  # required: a call
    await adapter_for(endpoint_for(anthropic_server, model="claude-test")).complete(request)

    (sent,) = anthropic_server.requests
    assert sent.path == "/v1/messages"
    assert sent.headers["x-api-key"] == KEY and "authorization" not in sent.headers
    assert sent.headers["anthropic-version"] == API_VERSION
    body = sent.body
    assert (body["model"], body["stream"], body["max_tokens"], body["temperature"]) == (
        "claude-test",
        True,
        DEFAULT_MAX_TOKENS,
        0.5,
    )
    assert body["system"] == "You are helpful.\n\nAnswer now."
    assert body["tools"] == [
        {
            "name": "query_orders",
            "description": "Find orders.",
            "input_schema": ORDERS_TOOL.parameters,
        }
    ]
    assert body["tool_choice"] == {"type": "any"}
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "find orders"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Looking."},
                {"type": "tool_use", "id": "toolu_1", "name": "query_orders", "input": {"days": 7}},
                {
                    "type": "tool_use",
                    "id": "toolu_2",
                    "name": "query_orders",
                    "input": {"days": 30},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": '{"count": 0}'},
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_2",
                    "content": "failed",
                    "is_error": True,
                },
            ],
        },
    ]


@pytest.mark.parametrize(
    ("choice", "wire"),
    [
        ("auto", {"type": "auto"}),
        ("none", {"type": "none"}),
        ("required", {"type": "any"}),
        ("query_orders", {"type": "tool", "name": "query_orders"}),
    ],
)
async def test_tool_choice_on_the_wire(anthropic_server, endpoint_for, choice, wire):
    forced = choice not in ("auto", "none")
    anthropic_server.script(Reply(calls=[Call("query_orders")]) if forced else Reply(text="ok"))
    await adapter_for(endpoint_for(anthropic_server)).complete(
        ChatRequest(messages=HELLO.messages, tools=(ORDERS_TOOL,), tool_choice=choice)
    )
    body = anthropic_server.requests[0].body
    assert body["tool_choice"] == wire
    assert [t["name"] for t in body["tools"]] == ["query_orders"]


@pytest.mark.parametrize(
    ("choice", "wire"),
    [
        ("auto", {"type": "auto", "disable_parallel_tool_use": True}),
        ("none", {"type": "none"}),  # no call at all: nothing to disable
        (
            "query_orders",
            {"type": "tool", "name": "query_orders", "disable_parallel_tool_use": True},
        ),
    ],
)
async def test_parallel_tool_calls_off_on_the_wire(anthropic_server, endpoint_for, choice, wire):
    reply = Reply(text="ok") if choice == "none" else Reply(calls=[Call("query_orders")])
    anthropic_server.script(reply)
    request = ChatRequest(
        messages=HELLO.messages, tools=(ORDERS_TOOL,), tool_choice=choice, parallel_tool_calls=False
    )
    await adapter_for(endpoint_for(anthropic_server)).complete(request)
    assert anthropic_server.requests[0].body["tool_choice"] == wire


async def test_max_tokens_comes_from_options(anthropic_server, endpoint_for):
    anthropic_server.script(Reply(text="ok"))
    adapter = adapter_for(endpoint_for(anthropic_server, options={"max_tokens": 123}))
    await adapter.complete(HELLO)
    body = anthropic_server.requests[0].body
    assert "tools" not in body and "tool_choice" not in body and body["max_tokens"] == 123


# Failures -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error_type", "expected"),
    [
        ("overloaded_error", ModelUnavailable),
        ("api_error", ModelUnavailable),
        ("invalid_request_error", ModelProtocolError),
    ],
)
async def test_an_error_event_mid_stream(anthropic_server, endpoint_for, error_type, expected):
    problem = {"type": "error", "error": {"type": error_type, "message": "Overloaded right now"}}
    anthropic_server.script(Reply(text="one two three", error_event_at=4, error_event=problem))
    with pytest.raises(expected) as caught:
        await adapter_for(endpoint_for(anthropic_server)).complete(HELLO)
    assert "Overloaded right now" in str(caught.value)


async def test_a_missing_message_stop_is_a_protocol_error(anthropic_server, endpoint_for):
    anthropic_server.script(Reply(text="almost", no_done=True))
    with pytest.raises(ModelProtocolError) as caught:
        await adapter_for(endpoint_for(anthropic_server)).complete(HELLO)
    assert "message_stop" in str(caught.value)


async def test_a_tool_use_block_never_closed_is_a_protocol_error(anthropic_server, endpoint_for):
    events = [
        sse({"type": "message_start", "message": {"usage": {"input_tokens": 1}}}, "message_start"),
        sse(
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "tool_use", "id": "t", "name": "query_orders"},
            }
        ),
        sse(
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "input_json_delta", "partial_json": '{"days": 1}'},
            }
        ),
        sse({"type": "message_stop"}, "message_stop"),
    ]
    anthropic_server.script(Reply(events=events))
    with pytest.raises(ModelProtocolError):
        await adapter_for(endpoint_for(anthropic_server)).complete(HELLO)


@pytest.mark.parametrize("chunked", [False, True], ids=["close-delimited", "chunked"])
async def test_a_stream_cut_midway_is_a_protocol_error(anthropic_server, endpoint_for, chunked):
    anthropic_server.script(Reply(text="this will be cut", cut_after=4, chunked=chunked))
    with pytest.raises(ModelProtocolError):
        await adapter_for(endpoint_for(anthropic_server)).complete(HELLO)


async def test_an_event_that_is_not_json_is_a_protocol_error(anthropic_server, endpoint_for):
    anthropic_server.script(Reply(text="a b c", bad_json_at=3))
    with pytest.raises(ModelProtocolError):
        await adapter_for(endpoint_for(anthropic_server)).complete(HELLO)


@pytest.mark.parametrize(
    "event",
    [
        sse([1, 2]),
        sse(
            {
                "type": "content_block_delta",
                "index": "zero",
                "delta": {"type": "text_delta", "text": "x"},
            }
        ),
        sse(
            {
                "type": "content_block_delta",
                "index": True,
                "delta": {"type": "text_delta", "text": "x"},
            }
        ),
        sse({"type": "content_block_start", "index": 0, "content_block": "text"}),
        sse({"type": "message_delta", "delta": {}, "usage": {"output_tokens": "lots"}}),
        sse({"type": "error", "error": "just a string"}),
    ],
    ids=["list", "index-string", "index-bool", "block-string", "usage-string", "error-string"],
)
async def test_events_of_an_unexpected_shape_are_protocol_errors(
    anthropic_server, endpoint_for, event
):
    anthropic_server.script(Reply(text="hello", insert=[(2, event)]))
    with pytest.raises(ModelProtocolError):
        await adapter_for(endpoint_for(anthropic_server)).complete(HELLO)


@pytest.mark.parametrize(
    "body",
    [b"not json", b'{"content": "text"}', b'{"content": [], "usage": "none"}'],
    ids=["not-json", "content-string", "usage-string"],
)
async def test_non_streamed_answers_of_an_unexpected_shape_are_protocol_errors(
    anthropic_server, endpoint_for, body
):
    anthropic_server.script(Reply(raw_body=body))
    with pytest.raises(ModelProtocolError):
        await adapter_for(endpoint_for(anthropic_server)).respond(HELLO)


async def test_invalid_utf8_bytes_become_replacement_characters(anthropic_server, endpoint_for):
    anthropic_server.script(
        Reply(text="start end", insert=[(4, invalid_utf8_event("anthropic", index=0))])
    )
    response = await adapter_for(endpoint_for(anthropic_server)).complete(HELLO)
    assert "bad \ufffd\ufffd bytes" in response.text and response.text.startswith("start")


async def test_an_empty_answer_is_empty_not_an_exception(anthropic_server, endpoint_for):
    anthropic_server.script(Reply(text="", usage=None))
    response = await adapter_for(endpoint_for(anthropic_server)).complete(HELLO)
    assert (response.text, response.tool_calls, response.usage) == ("", [], Usage(0, 0))


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        (Reply(status=429, headers={"Retry-After": "3"}), ModelRateLimited),
        (Reply(status=529, error_message="Overloaded"), ModelUnavailable),
        (Reply(status=500), ModelUnavailable),
        (Reply(status=400, error_message="max_tokens: too large"), ModelConfigError),
        (Reply(status=401), ModelConfigError),
    ],
    ids=["429", "529", "500", "400", "401"],
)
async def test_http_errors_map_to_typed_errors(anthropic_server, endpoint_for, reply, expected):
    anthropic_server.script(reply)
    with pytest.raises(expected) as caught:
        await adapter_for(endpoint_for(anthropic_server)).complete(HELLO)
    if expected is ModelRateLimited:
        assert caught.value.retry_after_s == 3.0
    assert caught.value.retryable is (expected is not ModelConfigError)


async def test_never_a_byte_times_out_within_the_first_token_timeout(
    anthropic_server, endpoint_for
):
    anthropic_server.script(Reply(hang=True))
    started = time.monotonic()
    with pytest.raises(ModelTimeout):
        await adapter_for(endpoint_for(anthropic_server, first_token_timeout_s=0.5)).complete(HELLO)
    assert time.monotonic() - started < 1.5


@pytest.mark.parametrize(
    "reply",
    [
        Reply(status=401, echo_key=True),
        Reply(status=529, echo_key=True),
        Reply(text="a b c", error_event_at=3, echo_key=True),
    ],
    ids=["401", "529", "mid-stream"],
)
async def test_an_error_message_never_carries_the_api_key(anthropic_server, endpoint_for, reply):
    anthropic_server.script(reply)
    with pytest.raises(ModelError) as caught:
        await adapter_for(endpoint_for(anthropic_server)).complete(HELLO)
    assert anthropic_server.requests[0].headers["x-api-key"] == KEY
    assert KEY not in str(caught.value)


async def test_tool_ids_from_other_models_are_made_unique_and_valid(anthropic_server, endpoint_for):
    # Two steps of another model that reused its ids, one id the API would refuse and
    # an empty assistant turn: the API wants unique ids matching ^[a-zA-Z0-9_-]+$.
    def step(call_id: str, days: int) -> tuple[ChatMessage, ChatMessage]:
        return (
            ChatMessage(
                role="assistant",
                tool_calls=(
                    ToolCallRequest(id=call_id, name="query_orders", arguments={"days": days}),
                ),
            ),
            ChatMessage(
                role="tool", content=f"result {days}", tool_call_id=call_id, name="query_orders"
            ),
        )

    history = (
        ChatMessage(role="user", content="go"),
        *step("call_0", 1),
        *step("call_0", 2),
        *step("call:weird/id", 3),
        *step("", 4),
        ChatMessage(role="assistant", content=""),
        ChatMessage(role="user", content="and?"),
    )
    anthropic_server.script(Reply(text="ok"))
    response = await adapter_for(endpoint_for(anthropic_server)).complete(
        ChatRequest(messages=history)
    )
    assert response.text == "ok" and anthropic_server.invalid == []

    messages = anthropic_server.requests[0].messages
    uses = [b["id"] for m in messages for b in m["content"] if b["type"] == "tool_use"]
    results = [
        b["tool_use_id"] for m in messages for b in m["content"] if b["type"] == "tool_result"
    ]
    assert uses == ["call_0", "call_0_2", "call_weird_id", "toolu"]
    assert results == uses  # each result answers the call right before it
    assert [b["content"] for m in messages for b in m["content"] if b["type"] == "tool_result"] == [
        "result 1",
        "result 2",
        "result 3",
        "result 4",
    ]
