"""The OpenAI Chat Completions adapter against a real (fake) HTTP server speaking the wire format."""

import json
import time
from typing import Any

import pytest

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
from tests.fakes.model_servers import Call, Reply, invalid_utf8_event

from .conftest import KEY

HELLO = ChatRequest(messages=(ChatMessage(role="user", content="hi"),))
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
    parameters={
        "type": "object",
        "properties": {"customer_id": {"type": "integer"}, "message": {"type": "string"}},
    },
)

# A request offering the tools the scripts call (the strict fake server refuses any other).
ASK_ORDERS = ChatRequest(messages=HELLO.messages, tools=(ORDERS_TOOL, NOTIFY_TOOL))


async def collect(adapter: Any, request: ChatRequest = HELLO) -> list[StreamEvent]:
    return [event async for event in adapter.stream(request)]


# Text ---------------------------------------------------------------------------------


async def test_streamed_text_arrives_as_deltas_then_usage_and_finish(openai_server, endpoint_for):
    openai_server.script(Reply(text="Hello there, how are you?", usage=(21, 7)))
    events = await collect(adapter_for(endpoint_for(openai_server)))

    deltas = [e.text for e in events if isinstance(e, TextDelta)]
    assert len(deltas) > 1 and "".join(deltas) == "Hello there, how are you?"
    assert events[-2:] == [Usage(21, 7), Finish("stop")]
    assert not any(isinstance(e, ToolCallStarted) for e in events)


async def test_complete_joins_the_stream_into_one_response(openai_server, endpoint_for):
    openai_server.script(Reply(text="Grüße aus Zürich 🎉", text_splits=3, usage=(5, 6)))
    seen: list[StreamEvent] = []
    response = await adapter_for(endpoint_for(openai_server)).complete(HELLO, on_event=seen.append)
    assert response.text == "Grüße aus Zürich 🎉"
    assert (
        response.usage == Usage(5, 6)
        and response.finish_reason == "stop"
        and response.tool_calls == []
    )
    assert len(seen) == len(range(0, len("Grüße aus Zürich 🎉"), 3)) + 2


async def test_non_streamed_text_with_respond(openai_server, endpoint_for):
    openai_server.script(Reply(text="A whole answer.", usage=(30, 4)))
    response = await adapter_for(endpoint_for(openai_server)).respond(HELLO)
    assert (response.text, response.usage, response.finish_reason) == (
        "A whole answer.",
        Usage(30, 4),
        "stop",
    )
    body = openai_server.requests[0].body
    assert "stream" not in body and "stream_options" not in body


async def test_no_usage_chunk_means_no_usage_event(openai_server, endpoint_for):
    openai_server.script(Reply(text="No usage here.", usage=None))
    events = await collect(adapter_for(endpoint_for(openai_server)))
    assert not any(isinstance(e, Usage) for e in events)
    assert events[-1] == Finish("stop")


async def test_length_finish_reason_is_reported(openai_server, endpoint_for):
    openai_server.script(Reply(text="cut short", finish_reason="length"))
    response = await adapter_for(endpoint_for(openai_server)).complete(HELLO)
    assert response.finish_reason == "length"


@pytest.mark.parametrize(
    ("chunk", "expected"),
    [
        (
            {"choices": [{"delta": {"content": "last"}, "finish_reason": "length"}]},
            [TextDelta("last"), Finish("length")],
        ),
        (
            {
                "choices": [{"delta": {"content": "counted"}}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 4},
            },
            [TextDelta("counted"), Usage(3, 4), Finish("stop")],
        ),
        (
            {"choices": [{"delta": {"content": "a"}}, {"delta": {"content": "b"}}]},
            [TextDelta("a"), TextDelta("b"), Finish("stop")],
        ),
        ({"choices": [{"delta": {"content": ""}}]}, [Finish("stop")]),
    ],
    ids=["text-and-finish", "text-and-usage", "two-choices", "empty-text"],
)
async def test_text_chunks_that_carry_more_than_text_lose_nothing(
    openai_server, endpoint_for, chunk, expected
):
    # Plain text deltas take a short path; a chunk with anything else must not.
    wire = b'data: {"choices": [{"delta": {"role": "assistant", "content": ""}}]}\n\n'
    wire += ("data: " + json.dumps(chunk) + "\n\ndata: [DONE]\n\n").encode()
    openai_server.script(Reply(raw_body=wire))
    assert await collect(adapter_for(endpoint_for(openai_server))) == expected


# Tool calls ---------------------------------------------------------------------------


async def test_one_tool_call_with_arguments_split_mid_token(openai_server, endpoint_for):
    arguments = '{"days": 7, "logistics_status": "exception"}'
    # Cuts inside `"days"`, inside the number's key and inside `"exception"`.
    openai_server.script(
        Reply(calls=[Call("query_orders", arguments, id="call_abc", splits=[3, 9, 30, 38])])
    )
    events = await collect(
        adapter_for(endpoint_for(openai_server)),
        ChatRequest(messages=HELLO.messages, tools=(ORDERS_TOOL,)),
    )

    assert events[0] == ToolCallStarted(index=0, id="call_abc", name="query_orders")
    fragments = [e.fragment for e in events if isinstance(e, ToolCallArgumentsDelta)]
    assert fragments == [
        arguments[:3],
        arguments[3:9],
        arguments[9:30],
        arguments[30:38],
        arguments[38:],
    ]
    finished = [e for e in events if isinstance(e, ToolCallFinished)]
    assert finished == [
        ToolCallFinished(
            0,
            ToolCallRequest(
                id="call_abc",
                name="query_orders",
                arguments={"days": 7, "logistics_status": "exception"},
            ),
        )
    ]
    assert events[-1] == Finish("tool_calls")


async def test_parallel_tool_calls_interleaved_and_split_inside_multibyte_characters(
    openai_server, endpoint_for
):
    calls = [
        Call(
            "send_notification",
            {"customer_id": 1, "message": "Grüße, Ihr Paket ist in Zürich 📦"},
            splits=5,
        ),
        Call("send_notification", {"customer_id": 2, "message": "您的包裹已延误 🚚"}, splits=4),
        Call(
            "send_notification", {"customer_id": 3, "message": "Ça va? — ok"}, splits=[1, 2, 3, 17]
        ),
    ]
    # Interleaved fragments (index 0,1,2,0,1,2,...), and every network write cut
    # inside a multi-byte UTF-8 character as well as every 7 bytes.
    openai_server.script(
        Reply(
            calls=calls,
            interleave=True,
            write_size=7,
            split_multibyte=True,
            write_pause_s=0.0005,
            usage=(40, 60),
        )
    )
    response = await adapter_for(endpoint_for(openai_server)).complete(
        ChatRequest(messages=HELLO.messages, tools=(NOTIFY_TOOL,))
    )
    assert [c.arguments for c in response.tool_calls] == [c.arguments for c in calls]
    assert [c.id for c in response.tool_calls] == ["call_fake_0", "call_fake_1", "call_fake_2"]
    assert all(c.arguments_error is None for c in response.tool_calls)
    assert response.finish_reason == "tool_calls" and response.usage == Usage(40, 60)


async def test_interleaved_fragments_are_reassembled_per_index(openai_server, endpoint_for):
    calls = [
        Call("query_orders", {"days": 7}, splits=2),
        Call("query_orders", {"days": 30}, splits=3),
    ]
    openai_server.script(Reply(calls=calls, interleave=True))
    events = await collect(adapter_for(endpoint_for(openai_server)), ASK_ORDERS)
    order = [e.index for e in events if isinstance(e, ToolCallArgumentsDelta)]
    assert order[:4] == [0, 1, 0, 1]  # really interleaved on the wire
    assert [e.index for e in events if isinstance(e, ToolCallStarted)] == [0, 1]
    finished = [e.call.arguments for e in events if isinstance(e, ToolCallFinished)]
    assert finished == [{"days": 7}, {"days": 30}]


@pytest.mark.parametrize(
    "mode", ["omit", "zero"], ids=["no-index-like-gemini", "all-index-0-like-ollama"]
)
async def test_servers_that_omit_or_reuse_the_index_still_give_separate_calls(
    openai_server, endpoint_for, mode
):
    calls = [
        Call("query_orders", {"days": 7}, id="call_a", splits=4),
        Call("query_orders", {"days": 30}, id="call_b", splits=5),
    ]
    openai_server.script(Reply(calls=calls, index_mode=mode))
    events = await collect(adapter_for(endpoint_for(openai_server)), ASK_ORDERS)
    assert [(e.index, e.id) for e in events if isinstance(e, ToolCallStarted)] == [
        (0, "call_a"),
        (1, "call_b"),
    ]
    finished = [e.call for e in events if isinstance(e, ToolCallFinished)]
    assert [(c.id, c.arguments, c.arguments_error) for c in finished] == [
        ("call_a", {"days": 7}, None),
        ("call_b", {"days": 30}, None),
    ]


async def test_an_id_repeated_in_every_fragment_is_still_one_call(openai_server, endpoint_for):
    repeat = [
        b'data: {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "call_r", "type": "function", "function": {"name": "query_orders", "arguments": "{\\"da"}}]}}]}\n\n',
        b'data: {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "call_r", "function": {"arguments": "ys\\": 2}"}}]}}]}\n\n',
        b'data: {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}\n\n',
        b"data: [DONE]\n\n",
    ]
    openai_server.script(Reply(events=repeat))
    response = await adapter_for(endpoint_for(openai_server)).complete(HELLO)
    assert [(c.id, c.arguments) for c in response.tool_calls] == [("call_r", {"days": 2})]


async def test_text_before_tool_calls_is_kept(openai_server, endpoint_for):
    openai_server.script(Reply(text="Let me look.", calls=[Call("query_orders", {"days": 1})]))
    response = await adapter_for(endpoint_for(openai_server)).complete(ASK_ORDERS)
    assert response.text == "Let me look." and response.tool_calls[0].name == "query_orders"


async def test_tool_arguments_that_are_not_json_are_reported_not_raised(
    openai_server, endpoint_for
):
    openai_server.script(
        Reply(calls=[Call("query_orders", '{"days": 7,, oops'), Call("query_orders", "[1, 2]")])
    )
    response = await adapter_for(endpoint_for(openai_server)).complete(ASK_ORDERS)
    broken, not_object = response.tool_calls
    assert (
        broken.arguments == {} and broken.arguments_error and "position" in broken.arguments_error
    )
    assert not_object.arguments == {} and "expected a JSON object" in (
        not_object.arguments_error or ""
    )


async def test_non_streamed_tool_calls(openai_server, endpoint_for):
    openai_server.script(
        Reply(calls=[Call("query_orders", {"days": 3}, id="call_1"), Call("query_orders", "{bad")])
    )
    response = await adapter_for(endpoint_for(openai_server)).respond(ASK_ORDERS)
    assert response.finish_reason == "tool_calls"
    assert response.tool_calls[0] == ToolCallRequest(
        id="call_1", name="query_orders", arguments={"days": 3}
    )
    assert response.tool_calls[1].arguments_error


# The request --------------------------------------------------------------------------


async def test_request_payload_and_headers(openai_server, endpoint_for):
    history = (
        ChatMessage(role="system", content="You are helpful."),
        ChatMessage(role="user", content="find orders"),
        ChatMessage(
            role="assistant",
            content="",
            tool_calls=(
                ToolCallRequest(id="call_1", name="query_orders", arguments={"days": 7}),
                ToolCallRequest(
                    id="call_2",
                    name="send_notification",
                    arguments={"customer_id": 1, "message": "Grüße"},
                ),
            ),
        ),
        ChatMessage(
            role="tool", content='{"count": 0}', tool_call_id="call_1", name="query_orders"
        ),
        ChatMessage(
            role="tool", content='{"ok": true}', tool_call_id="call_2", name="send_notification"
        ),
    )
    request = ChatRequest(
        messages=history, tools=(ORDERS_TOOL, NOTIFY_TOOL), temperature=0.2, max_tokens=300
    )
    openai_server.script(Reply(text="done"))
    await adapter_for(endpoint_for(openai_server, model="gpt-test")).complete(request)

    (sent,) = openai_server.requests
    assert sent.path == "/v1/chat/completions"
    assert sent.headers["authorization"] == f"Bearer {KEY}"
    assert sent.headers["content-type"] == "application/json"
    body = sent.body
    assert body["model"] == "gpt-test"
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert (body["temperature"], body["max_tokens"]) == (0.2, 300)
    assert body["tool_choice"] == "auto"
    assert body["tools"] == [
        {
            "type": "function",
            "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
        }
        for t in (ORDERS_TOOL, NOTIFY_TOOL)
    ]
    assert body["messages"][0] == {"role": "system", "content": "You are helpful."}
    assert body["messages"][1] == {"role": "user", "content": "find orders"}
    assistant = body["messages"][2]
    assert assistant["role"] == "assistant" and assistant["content"] is None
    assert [
        (c["id"], c["type"], c["function"]["name"], json.loads(c["function"]["arguments"]))
        for c in assistant["tool_calls"]
    ] == [
        ("call_1", "function", "query_orders", {"days": 7}),
        ("call_2", "function", "send_notification", {"customer_id": 1, "message": "Grüße"}),
    ]
    assert body["messages"][3:] == [
        {"role": "tool", "tool_call_id": "call_1", "content": '{"count": 0}'},
        {"role": "tool", "tool_call_id": "call_2", "content": '{"ok": true}'},
    ]


@pytest.mark.parametrize(
    ("choice", "wire"),
    [
        ("required", "required"),
        ("none", "none"),
        ("query_orders", {"type": "function", "function": {"name": "query_orders"}}),
    ],
)
async def test_tool_choice_on_the_wire(openai_server, endpoint_for, choice, wire):
    # A forced choice is answered with the call (the strict fake server holds the model to it).
    openai_server.script(
        Reply(text="ok") if choice == "none" else Reply(calls=[Call("query_orders")])
    )
    await adapter_for(endpoint_for(openai_server)).complete(
        ChatRequest(messages=HELLO.messages, tools=(ORDERS_TOOL,), tool_choice=choice)
    )
    assert openai_server.requests[0].body["tool_choice"] == wire
    assert "parallel_tool_calls" not in openai_server.requests[0].body  # the wire's default


async def test_parallel_tool_calls_off_on_the_wire(openai_server, endpoint_for):
    openai_server.script(Reply(calls=[Call("query_orders")]))
    response = await adapter_for(endpoint_for(openai_server)).complete(
        ChatRequest(messages=HELLO.messages, tools=(ORDERS_TOOL,), parallel_tool_calls=False)
    )
    assert openai_server.requests[0].body["parallel_tool_calls"] is False
    assert [c.name for c in response.tool_calls] == ["query_orders"]


async def test_no_tools_means_no_tools_field_and_no_key_means_no_auth_header(
    openai_server, endpoint_for
):
    openai_server.script(Reply(text="ok"))
    await adapter_for(endpoint_for(openai_server, api_key_env="")).complete(HELLO)
    sent = openai_server.requests[0]
    assert "tools" not in sent.body and "tool_choice" not in sent.body
    assert "authorization" not in sent.headers


async def test_sampling_and_the_answers_json_form_on_the_wire(openai_server, endpoint_for):
    adapter = adapter_for(endpoint_for(openai_server))
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    openai_server.script(*[Reply(text="{}")] * 3)
    await adapter.complete(
        ChatRequest(
            messages=HELLO.messages,
            top_p=0.5,
            stop=("END", "STOP"),
            seed=42,
            response_format=ResponseFormat(schema=schema, name="City", strict=True),
        )
    )
    await adapter.complete(
        ChatRequest(messages=HELLO.messages, response_format=ResponseFormat(schema=schema))
    )
    await adapter.complete(ChatRequest(messages=HELLO.messages, response_format=ResponseFormat()))
    strict, plain, any_object = (r.body for r in openai_server.requests)
    assert (strict["top_p"], strict["stop"], strict["seed"]) == (0.5, ["END", "STOP"], 42)
    assert strict["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "City", "schema": schema, "strict": True},
    }
    assert plain["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "answer", "schema": schema},
    }
    assert any_object["response_format"] == {"type": "json_object"}
    assert not {"top_p", "stop", "seed"} & set(plain)


# Failures -----------------------------------------------------------------------------


async def test_429_with_retry_after_is_rate_limited(openai_server, endpoint_for):
    openai_server.script(Reply(status=429, headers={"Retry-After": "2"}))
    with pytest.raises(ModelRateLimited) as caught:
        await adapter_for(endpoint_for(openai_server)).complete(HELLO)
    assert (
        caught.value.retry_after_s == 2.0
        and caught.value.retryable
        and caught.value.outcome == "rate_limited"
    )


async def test_429_with_an_unparseable_retry_after_is_still_rate_limited(
    openai_server, endpoint_for
):
    openai_server.script(Reply(status=429, headers={"Retry-After": "soon, maybe"}))
    with pytest.raises(ModelRateLimited) as caught:
        await adapter_for(endpoint_for(openai_server)).complete(HELLO)
    assert caught.value.retry_after_s is None


async def test_500_is_unavailable_and_retryable(openai_server, endpoint_for):
    openai_server.script(Reply(status=500, error_message="upstream exploded"))
    with pytest.raises(ModelUnavailable) as caught:
        await adapter_for(endpoint_for(openai_server)).complete(HELLO)
    assert (
        caught.value.retryable
        and "HTTP 500" in str(caught.value)
        and "upstream exploded" in str(caught.value)
    )


async def test_400_is_a_config_error_and_not_retryable(openai_server, endpoint_for):
    openai_server.script(Reply(status=400, error_message="model 'x' does not exist"))
    with pytest.raises(ModelConfigError) as caught:
        await adapter_for(endpoint_for(openai_server)).respond(HELLO)
    assert not caught.value.retryable and caught.value.outcome == "bad_request"


async def test_connection_refused_is_unavailable(endpoint_for, openai_server, dead_url):
    config = endpoint_for(openai_server)
    adapter = adapter_for(type(config)(**{**config.__dict__, "base_url": dead_url}))
    with pytest.raises(ModelUnavailable) as caught:
        await adapter.complete(HELLO)
    assert "cannot reach" in str(caught.value)


async def test_a_server_that_never_sends_a_byte_times_out_on_the_first_token(
    openai_server, endpoint_for
):
    openai_server.script(Reply(hang=True))
    started = time.monotonic()
    with pytest.raises(ModelTimeout) as caught:
        await adapter_for(endpoint_for(openai_server, first_token_timeout_s=0.5)).complete(HELLO)
    assert 0.4 < time.monotonic() - started < 1.5
    assert "first" in str(caught.value) or "no answer" in str(caught.value)


async def test_headers_then_silence_times_out_on_the_first_token(openai_server, endpoint_for):
    openai_server.script(Reply(text="never", stall_after=0))
    started = time.monotonic()
    with pytest.raises(ModelTimeout):
        await adapter_for(endpoint_for(openai_server, first_token_timeout_s=0.5)).complete(HELLO)
    assert time.monotonic() - started < 1.5


async def test_a_stream_that_stalls_midway_hits_the_total_timeout(openai_server, endpoint_for):
    openai_server.script(Reply(text="one two three four", stall_after=3))
    seen: list[StreamEvent] = []
    started = time.monotonic()
    with pytest.raises(ModelTimeout) as caught:
        await adapter_for(
            endpoint_for(openai_server, first_token_timeout_s=0.5, total_timeout_s=1.0)
        ).complete(HELLO, on_event=seen.append)
    assert 0.9 < time.monotonic() - started < 2.0
    assert "did not finish" in str(caught.value)
    assert seen  # the first tokens did arrive


async def test_a_slow_but_steady_stream_is_not_a_first_token_timeout(openai_server, endpoint_for):
    # The whole answer takes longer than the first-token window; only the first
    # byte must beat it (a wide margin, for a loaded CI machine).
    openai_server.script(Reply(text="a b c d e f", delay_s=0.3))
    response = await adapter_for(
        endpoint_for(openai_server, first_token_timeout_s=1.0, total_timeout_s=10)
    ).complete(HELLO)
    assert response.text == "a b c d e f"


@pytest.mark.parametrize("chunked", [False, True], ids=["close-delimited", "chunked"])
async def test_a_stream_cut_midway_is_a_protocol_error(openai_server, endpoint_for, chunked):
    openai_server.script(Reply(text="this answer will be cut short", cut_after=3, chunked=chunked))
    with pytest.raises(ModelProtocolError):
        await adapter_for(endpoint_for(openai_server)).complete(HELLO)


async def test_chunked_transfer_encoding_is_fine(openai_server, endpoint_for):
    openai_server.script(Reply(text="chunked answer", chunked=True, write_size=11))
    assert (await adapter_for(endpoint_for(openai_server)).complete(HELLO)).text == "chunked answer"


async def test_a_missing_done_is_a_protocol_error(openai_server, endpoint_for):
    openai_server.script(Reply(text="almost complete", no_done=True))
    with pytest.raises(ModelProtocolError) as caught:
        await adapter_for(endpoint_for(openai_server)).complete(HELLO)
    assert "[DONE]" in str(caught.value)


async def test_an_invalid_json_chunk_is_a_protocol_error(openai_server, endpoint_for):
    openai_server.script(Reply(text="one two three", bad_json_at=2))
    with pytest.raises(ModelProtocolError) as caught:
        await adapter_for(endpoint_for(openai_server)).complete(HELLO)
    assert "not JSON" in str(caught.value)


async def test_an_error_chunk_mid_stream_is_a_protocol_error(openai_server, endpoint_for):
    openai_server.script(Reply(text="one two three", error_event_at=2))
    with pytest.raises(ModelProtocolError) as caught:
        await adapter_for(endpoint_for(openai_server)).complete(HELLO)
    assert "fake mid-stream failure" in str(caught.value)


async def test_invalid_utf8_bytes_become_replacement_characters(openai_server, endpoint_for):
    openai_server.script(Reply(text="before after", insert=[(2, invalid_utf8_event("openai"))]))
    response = await adapter_for(endpoint_for(openai_server)).complete(HELLO)
    assert response.text == "before bad \ufffd\ufffd bytes after"


async def test_an_empty_answer_is_empty_not_an_exception(openai_server, endpoint_for):
    openai_server.script(Reply(text=""))
    response = await adapter_for(endpoint_for(openai_server)).complete(HELLO)
    assert (response.text, response.tool_calls) == ("", [])


@pytest.mark.parametrize(
    "event",
    [
        b"data: [1, 2, 3]\n\n",
        b'data: {"choices": 5}\n\n',
        b'data: {"choices": [{"delta": "text"}]}\n\n',
        b'data: {"choices": [{"delta": {"tool_calls": ["x"]}}]}\n\n',
        b'data: {"choices": [{"delta": {"tool_calls": [{"index": "first", "function": {"name": "a"}}]}}]}\n\n',
        b'data: {"choices": [], "usage": {"prompt_tokens": "many"}}\n\n',
        b'data: {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}}]}\n\n',
    ],
    ids=[
        "list",
        "choices-number",
        "delta-string",
        "call-string",
        "index-string",
        "usage-string",
        "call-without-name",
    ],
)
async def test_chunks_of_an_unexpected_shape_are_protocol_errors(
    openai_server, endpoint_for, event
):
    openai_server.script(Reply(text="hello", insert=[(1, event)]))
    with pytest.raises(ModelProtocolError):
        await adapter_for(endpoint_for(openai_server)).complete(HELLO)


@pytest.mark.parametrize(
    "body",
    [b"<html>bad gateway</html>", b'{"choices": []}', b'{"choices": [{"message": "hi"}]}', b"[]"],
    ids=["not-json", "no-choices", "message-string", "list"],
)
async def test_non_streamed_answers_of_an_unexpected_shape_are_protocol_errors(
    openai_server, endpoint_for, body
):
    openai_server.script(Reply(raw_body=body))
    with pytest.raises(ModelProtocolError):
        await adapter_for(endpoint_for(openai_server)).respond(HELLO)


async def test_a_non_streamed_body_cut_short_is_an_error(openai_server, endpoint_for):
    openai_server.script(Reply(text="a long answer " * 20, cut_after=40))
    with pytest.raises(ModelError) as caught:
        await adapter_for(endpoint_for(openai_server)).respond(HELLO)
    assert caught.value.outcome == "protocol_error"


@pytest.mark.parametrize(
    "reply",
    [
        Reply(status=401, echo_key=True),
        Reply(status=500, echo_key=True),
        Reply(status=429, echo_key=True, headers={"Retry-After": "1"}),
        Reply(text="a b c", error_event_at=2, echo_key=True),
    ],
    ids=["401", "500", "429", "mid-stream"],
)
async def test_an_error_message_never_carries_the_api_key(openai_server, endpoint_for, reply):
    openai_server.script(reply)
    with pytest.raises(ModelError) as caught:
        await adapter_for(endpoint_for(openai_server)).complete(HELLO)
    assert openai_server.requests[0].headers["authorization"] == f"Bearer {KEY}"
    assert KEY not in str(caught.value) and KEY not in repr(caught.value.args)
