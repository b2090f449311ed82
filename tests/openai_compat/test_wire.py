"""openai_compat.wire: which requests are served and how, and the objects answered."""

import json
from typing import Any

import pytest

from openai_compat.wire import (
    DONE,
    ChunkWriter,
    HistoryItem,
    RequestInvalid,
    ToolResult,
    chat_request_parse,
    completion,
    error_body,
    usage_of,
    wire_tool_call,
)


def _body(**extra: Any) -> dict[str, Any]:
    return {"model": "helper", "messages": [{"role": "user", "content": "hi"}], **extra}


def test_the_last_user_message_is_the_input_and_earlier_texts_the_history() -> None:
    chat = chat_request_parse(
        _body(
            messages=[
                {"role": "system", "content": "be brief"},
                {"role": "developer", "content": "be kind"},
                {"role": "user", "content": "my name is Ada"},
                {"role": "assistant", "content": None, "tool_calls": [{"id": "x"}]},
                {"role": "tool", "content": "42", "tool_call_id": "x"},
                {"role": "assistant", "content": [{"type": "text", "text": "Hello "}, {"type": "text", "text": "Ada"}]},
                {"role": "user", "content": "what is my name?"},
            ]
        )
    )  # fmt: skip
    assert chat.content == "what is my name?"
    assert chat.history == [
        HistoryItem("user", "my name is Ada"),
        HistoryItem("assistant", "Hello Ada"),
    ]
    assert chat.ignored_system_messages == 2
    assert (chat.stream, chat.include_usage) == (False, False)


def test_stream_options_are_read() -> None:
    chat = chat_request_parse(_body(stream=True, stream_options={"include_usage": True}))
    assert (chat.stream, chat.include_usage) == (True, True)


def test_sampling_parameters_go_with_the_turn() -> None:
    chat = chat_request_parse(
        _body(temperature=0.2, top_p=0.5, max_tokens=10, stop="END", seed=1, user="u", n=1)
    )
    assert chat.options == {
        "temperature": 0.2,
        "top_p": 0.5,
        "max_tokens": 10,
        "stop": ["END"],
        "seed": 1,
    }
    assert not chat.json_answer
    assert chat_request_parse(_body()).options == {}
    # max_completion_tokens is the newer name; with both, the tighter one.
    both = chat_request_parse(_body(max_tokens=50, max_completion_tokens=20, stop=["a", "b"]))
    assert (both.options["max_tokens"], both.options["stop"]) == (20, ["a", "b"])


def test_response_format_json_object_and_json_schema() -> None:
    assert (
        "response_format" not in chat_request_parse(_body(response_format={"type": "text"})).options
    )
    chat = chat_request_parse(_body(response_format={"type": "json_object"}))
    assert chat.options["response_format"] == {"schema": None, "name": "answer", "strict": False}
    assert chat.json_answer
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    chat = chat_request_parse(
        _body(
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "City", "schema": schema, "strict": True},
            }
        )
    )
    assert chat.options["response_format"] == {"schema": schema, "name": "City", "strict": True}


def test_what_clients_send_by_default_is_accepted() -> None:
    """The openai SDK, LangChain and the Agents SDK send these (or may): accepted at their
    defaults, and nulls are absent values."""
    chat = chat_request_parse(
        _body(
            n=1,
            parallel_tool_calls=True,
            tool_choice="auto",
            presence_penalty=0,
            frequency_penalty=0.0,
            logprobs=False,
            top_logprobs=0,
            logit_bias={},
            service_tier="auto",
            modalities=["text"],
            user="u-1",
            store=False,
            metadata={"app": "x"},
            safety_identifier="h-1",
            prompt_cache_key="k",
            stream=True,
            stream_options={"include_usage": True, "include_obfuscation": False},
            temperature=None,
            tools=None,
            reasoning_effort=None,
        )
    )
    assert (chat.options, chat.include_usage) == ({}, True)


@pytest.mark.parametrize(
    ("extra", "options"),
    [
        ({"tool_choice": "required"}, {"tool_choice": "required"}),
        ({"tool_choice": "none"}, {"tool_choice": "none"}),
        ({"tool_choice": "auto", "parallel_tool_calls": True}, {}),
        (
            {"tool_choice": {"type": "function", "function": {"name": "City"}},
             "parallel_tool_calls": False},
            {"tool_choice": "City", "parallel_tool_calls": False},
        ),
    ],
)  # fmt: skip
def test_tool_choice_and_parallel_tool_calls_go_with_the_turn(
    extra: dict[str, Any], options: dict[str, Any]
) -> None:
    """What LangChain's with_structured_output(method="function_calling") sends, among others."""
    assert chat_request_parse(_body(**extra)).options == options


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"n": 2}, "n"),
        ({"logprobs": True}, "logprobs"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"logit_bias": {"42": 5}}, "logit_bias"),
        ({"tool_choice": "any"}, "tool_choice"),
        ({"tool_choice": {"type": "function"}}, "tool_choice"),
        ({"tool_choice": {"type": "function", "function": {"name": "a.b"}}}, "tool_choice.function.name"),
        ({"parallel_tool_calls": "no"}, "parallel_tool_calls"),
        ({"reasoning_effort": "high"}, "reasoning_effort"),
        ({"audio": {"voice": "x"}}, "audio"),
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"frobnicate": 1}, "frobnicate"),
        ({"temperature": 3}, "temperature"),
        ({"temperature": "hot"}, "temperature"),
        ({"top_p": 1.5}, "top_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_completion_tokens": 2.5}, "max_completion_tokens"),
        ({"seed": True}, "seed"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"stop": [""]}, "stop[0]"),
        ({"metadata": "x"}, "metadata"),
        ({"stream_options": {"chunk": 1}}, "stream_options.chunk"),
        ({"response_format": "json"}, "response_format"),
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}},
            "response_format.json_schema.name",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "a b", "schema": {}}}},
            "response_format.json_schema.name",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "A"}}},
            "response_format.json_schema.schema",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "A", "schema": {"type": 5}}}},
            "response_format.json_schema.schema",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "A", "schema": {"const": "\x00"}}}},
            "response_format.json_schema.schema",
        ),
    ],
)  # fmt: skip
def test_a_parameter_the_platform_cannot_honour_is_refused_by_name(
    extra: dict[str, Any], param: str
) -> None:
    with pytest.raises(RequestInvalid) as refused:
        chat_request_parse(_body(**extra))
    assert refused.value.param == param


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ([], None),
        ({"messages": [{"role": "user", "content": "hi"}]}, "model"),
        (_body(model=""), "model"),
        (_body(messages=[]), "messages"),
        (_body(messages="hi"), "messages"),
        (_body(messages=[{"role": "assistant", "content": "hi"}]), "messages"),
        (_body(messages=[{"role": "user", "content": "   "}]), "messages"),
        (_body(messages=[{"role": "user", "content": None}]), "messages"),
        (_body(messages=[{"role": "wizard", "content": "hi"}]), "messages[0].role"),
        (_body(messages=[{"role": {}, "content": None}]), "messages[0].role"),
        (_body(n={}), "n"),
        (_body(messages=["hi"]), "messages[0]"),
        (_body(messages=[{"role": "user", "content": 3}]), "messages[0].content"),
        (
            _body(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
            "messages[0].content[0]",
        ),
        (_body(tools=[{"type": "function"}]), "tools[0].function"),
        (_body(n=2), "n"),
        (_body(stream="yes"), "stream"),
        (_body(stream_options=[]), "stream_options"),
        (_body(stream_options={"include_usage": "yes"}), "stream_options.include_usage"),
        (_body(messages=[{"role": "user", "content": "x"}] * 202), "messages"),
    ],
)
def test_requests_we_cannot_serve_name_the_offending_field(body: Any, param: str | None) -> None:
    with pytest.raises(RequestInvalid) as refused:
        chat_request_parse(body)
    assert refused.value.param == param


def test_a_completion_has_openais_fields_and_ours_apart() -> None:
    body = completion(
        id_="chatcmpl-1",
        model="helper",
        content="Hi",
        finish_reason="stop",
        usage=usage_of(3, 4),
        extension={"session_id": "s", "status": "finished", "stop_reason": "answer"},
        created=7,
    )
    assert body["object"] == "chat.completion"
    assert body["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Hi", "refusal": None},
            "logprobs": None,
            "finish_reason": "stop",
        }
    ]
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    assert body["agentplatform"]["session_id"] == "s"


def _data(event: bytes) -> Any:
    text = event.decode()
    assert text.startswith("data: ") and text.endswith("\n\n")
    return json.loads(text[len("data: ") :])


def test_chunks_carry_null_usage_only_when_usage_is_asked_for() -> None:
    plain = ChunkWriter(id_="c", model="m", include_usage=False, created=1)
    assert "usage" not in _data(plain.content("x"))
    counted = ChunkWriter(id_="c", model="m", include_usage=True, created=1)
    assert _data(counted.content("x"))["usage"] is None
    last = _data(counted.usage(usage_of(1, 2)))
    assert last["choices"] == [] and last["usage"]["total_tokens"] == 3
    role = _data(counted.role())["choices"][0]
    assert role["delta"] == {"role": "assistant", "content": ""} and role["finish_reason"] is None
    finish = _data(counted.finish("stop", {"session_id": "s", "status": "finished"}))
    assert finish["choices"][0] == {
        "index": 0,
        "delta": {},
        "logprobs": None,
        "finish_reason": "stop",
    }
    assert finish["agentplatform"]["status"] == "finished"
    assert DONE == b"data: [DONE]\n\n"


def test_error_body_is_openais_shape() -> None:
    assert error_body("nope", "invalid_request_error", "bad", "model") == {
        "error": {
            "message": "nope",
            "type": "invalid_request_error",
            "param": "model",
            "code": "bad",
        }
    }


def test_nul_characters_are_refused_naming_the_field() -> None:
    for body, param in [
        (_body(model="a\x00b"), "model"),
        (_body(messages=[{"role": "user", "content": "a\x00"}]), "messages[0].content"),
        (
            _body(messages=[{"role": "user", "content": [{"type": "text", "text": "\x00"}]}]),
            "messages[0].content[0].text",
        ),
    ]:
        with pytest.raises(RequestInvalid) as refused:
            chat_request_parse(body)
        assert refused.value.param == param


TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def test_the_clients_tools_go_with_the_turn() -> None:
    chat = chat_request_parse(_body(tools=[TOOL, {"type": "function", "function": {"name": "b"}}]))
    assert chat.options["tools"] == [
        {"name": "get_weather", "description": "Weather.", "parameters": TOOL["function"]["parameters"]},
        {"name": "b", "description": "", "parameters": {"type": "object", "properties": {}}},
    ]  # fmt: skip


def test_trailing_tool_messages_are_the_clients_results() -> None:
    chat = chat_request_parse(
        _body(
            messages=[
                {"role": "user", "content": "weather?"},
                {"role": "assistant", "content": None, "tool_calls": [{"id": "c1"}, {"id": "c2"}]},
                {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
                {"role": "tool", "tool_call_id": "c2", "content": [{"type": "text", "text": "12"}]},
            ],
            tools=[TOOL],
        )
    )
    assert chat.tool_results == [ToolResult("c1", "sunny"), ToolResult("c2", "12")]
    assert (chat.content, chat.history) == ("", [])


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tools": [{"type": "retrieval"}]}, "tools[0].type"),
        ({"tools": [{"type": "function", "function": {"name": "a.b"}}]}, "tools[0].function.name"),
        ({"tools": [TOOL, TOOL]}, "tools[1].function.name"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 1}}}]},
            "tools[0].function.parameters",
        ),
        ({"tools": [TOOL] * 129}, "tools"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id"),
        (
            {"messages": [{"role": "tool", "tool_call_id": "c", "content": "x"}] * 2},
            "messages",
        ),
    ],
)
def test_client_tools_and_results_we_cannot_take_name_the_field(
    extra: dict[str, Any], param: str
) -> None:
    with pytest.raises(RequestInvalid) as refused:
        chat_request_parse(_body(**extra))
    assert refused.value.param == param


def test_tool_calls_in_a_completion_and_in_a_chunk() -> None:
    call = wire_tool_call("c1", "get_weather", {"city": "Paris"})
    assert call == {
        "id": "c1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    body = completion(
        id_="x",
        model="m",
        content="",
        finish_reason="tool_calls",
        usage=usage_of(1, 1),
        extension={"session_id": "s", "status": "awaiting_tool_results"},
        tool_calls=[call],
    )
    message = body["choices"][0]["message"]
    assert (message["content"], message["tool_calls"]) == (None, [call])
    chunk = _data(ChunkWriter(id_="x", model="m", include_usage=False).tool_calls([call]))
    assert chunk["choices"][0]["delta"] == {"tool_calls": [{"index": 0, **call}]}
