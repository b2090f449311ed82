"""The fake model servers speak the real wire formats: the official SDKs parse their answers."""

import json

import anthropic
import httpx
import openai
import pytest

from tests.fakes.model_servers import Call, Reply

CALLS = [
    Call(
        "query_orders", {"days": 7, "logistics_status": "exception"}, id="call_q", splits=[2, 9, 20]
    ),
    Call(
        "send_notification",
        {"customer_id": 3, "message": "Grüße aus Zürich 📦"},
        id="call_n",
        splits=4,
    ),
]
# The tools CALLS call, offered in each wire's form (the strict servers refuse calls to others).
OPENAI_TOOLS = [
    {"type": "function", "function": {"name": c.name, "parameters": {"type": "object"}}}
    for c in CALLS
]
ANTHROPIC_TOOLS = [{"name": c.name, "input_schema": {"type": "object"}} for c in CALLS]


def test_openai_sdk_parses_a_streamed_text_answer(openai_server):
    openai_server.script(Reply(text="Hello, wörld! 🎉", text_splits=3, usage=(12, 5)))
    client = openai.OpenAI(api_key="sk-sdk", base_url=openai_server.base_url, max_retries=0)
    stream = client.chat.completions.create(
        model="gpt-fake",
        messages=[{"role": "user", "content": "hi"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Hello, wörld! 🎉"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (12, 5)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert openai_server.requests[0].headers["authorization"] == "Bearer sk-sdk"


def test_openai_sdk_accumulates_interleaved_streamed_tool_calls(openai_server):
    openai_server.script(
        Reply(text="Checking.", calls=CALLS, interleave=True, split_multibyte=True, usage=(30, 40))
    )
    client = openai.OpenAI(api_key="sk-sdk", base_url=openai_server.base_url, max_retries=0)
    with client.chat.completions.stream(
        model="gpt-fake",
        messages=[{"role": "user", "content": "go"}],
        tools=OPENAI_TOOLS,  # type: ignore[arg-type]
        stream_options={"include_usage": True},
    ) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    message = final.choices[0].message
    assert message.content == "Checking."
    assert [
        (c.id, c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []
    ] == [(c.id, c.name, c.arguments) for c in CALLS]
    assert final.choices[0].finish_reason == "tool_calls"
    assert final.usage is not None and final.usage.total_tokens == 70


def test_openai_sdk_parses_a_non_streamed_answer_and_errors(openai_server):
    openai_server.script(
        Reply(text="whole", calls=CALLS[:1]),
        Reply(status=429, headers={"Retry-After": "1"}),
        Reply(status=400),
    )
    client = openai.OpenAI(api_key="sk-sdk", base_url=openai_server.base_url, max_retries=0)
    completion = client.chat.completions.create(
        model="gpt-fake",
        messages=[{"role": "user", "content": "go"}],
        tools=OPENAI_TOOLS,  # type: ignore[arg-type]
    )
    assert completion.choices[0].message.content == "whole"
    assert completion.choices[0].message.tool_calls[0].function.name == "query_orders"  # type: ignore[index, union-attr]
    with pytest.raises(openai.RateLimitError):
        client.chat.completions.create(
            model="gpt-fake", messages=[{"role": "user", "content": "go"}]
        )
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model="gpt-fake", messages=[{"role": "user", "content": "go"}]
        )
    assert "fake provider error 400" in str(caught.value)


def test_anthropic_sdk_parses_a_streamed_text_answer(anthropic_server):
    anthropic_server.script(Reply(text="Hello, wörld! 🎉", text_splits=4, usage=(21, 8)))
    client = anthropic.Anthropic(
        api_key="ak-sdk", base_url=anthropic_server.base_url, max_retries=0
    )
    with client.messages.stream(
        model="claude-fake", max_tokens=100, messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "Hello, wörld! 🎉"
    assert final.stop_reason == "end_turn"
    assert (final.usage.input_tokens, final.usage.output_tokens) == (21, 8)


def test_anthropic_sdk_accumulates_streamed_tool_use_blocks(anthropic_server):
    anthropic_server.script(
        Reply(text="Checking.", calls=CALLS, split_multibyte=True, usage=(30, 40))
    )
    client = anthropic.Anthropic(
        api_key="ak-sdk", base_url=anthropic_server.base_url, max_retries=0
    )
    with client.messages.stream(
        model="claude-fake",
        max_tokens=100,
        messages=[{"role": "user", "content": "go"}],
        tools=ANTHROPIC_TOOLS,  # type: ignore[arg-type]
    ) as stream:
        final = stream.get_final_message()
    blocks = [(b.type, getattr(b, "text", None) or (b.id, b.name, b.input)) for b in final.content]  # type: ignore[union-attr]
    assert blocks == [
        ("text", "Checking."),
        *[("tool_use", (c.id, c.name, c.arguments)) for c in CALLS],
    ]
    assert final.stop_reason == "tool_use"


def test_anthropic_sdk_parses_a_non_streamed_answer_and_errors(anthropic_server):
    anthropic_server.script(
        Reply(text="whole", calls=CALLS[:1]), Reply(status=529), Reply(status=429)
    )
    client = anthropic.Anthropic(
        api_key="ak-sdk", base_url=anthropic_server.base_url, max_retries=0
    )
    message = client.messages.create(
        model="claude-fake",
        max_tokens=100,
        messages=[{"role": "user", "content": "go"}],
        tools=ANTHROPIC_TOOLS,  # type: ignore[arg-type]
    )
    assert [b.type for b in message.content] == ["text", "tool_use"]
    with pytest.raises(anthropic.APIStatusError) as overloaded:
        client.messages.create(
            model="claude-fake", max_tokens=100, messages=[{"role": "user", "content": "go"}]
        )
    assert overloaded.value.status_code == 529
    with pytest.raises(anthropic.RateLimitError):
        client.messages.create(
            model="claude-fake", max_tokens=100, messages=[{"role": "user", "content": "go"}]
        )


def test_the_server_records_requests_and_answers_500_when_the_script_is_empty(openai_server):
    response = httpx.post(
        openai_server.base_url + "/chat/completions",
        json={"model": "m", "messages": []},
        headers={"X-Test": "1"},
    )
    assert response.status_code == 500 and "no reply left" in response.text
    assert openai_server.unscripted == 1
    (recorded,) = openai_server.requests
    assert (recorded.path, recorded.body, recorded.headers["x-test"]) == (
        "/v1/chat/completions",
        {"model": "m", "messages": []},
        "1",
    )
    assert httpx.post(openai_server.base_url + "/embeddings", json={}).status_code == 404


def test_scripted_replies_can_be_built_from_the_request(openai_server):
    openai_server.script(lambda request: Reply(text=f"you said {request.messages[-1]['content']}"))
    client = openai.OpenAI(api_key="sk", base_url=openai_server.base_url, max_retries=0)
    completion = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "ping"}]
    )
    assert completion.choices[0].message.content == "you said ping"


def test_the_fakes_refuse_what_the_real_apis_refuse(openai_server, anthropic_server):
    anthropic_server.script(Reply(text="never sent"))
    client = anthropic.Anthropic(api_key="ak", base_url=anthropic_server.base_url, max_retries=0)
    duplicate = [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "a", "input": {}}],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "x"}]},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "a", "input": {}}],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "y"}]},
    ]
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(model="m", max_tokens=10, messages=duplicate)  # type: ignore[arg-type]
    assert "`tool_use` ids must be unique" in str(caught.value)
    assert anthropic_server.pending == 1  # the script was not consumed

    openai_server.script(Reply(text="never sent"))
    oclient = openai.OpenAI(api_key="sk", base_url=openai_server.base_url, max_retries=0)
    unanswered = [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "a", "arguments": "{}"}}
            ],
        },
        {"role": "user", "content": "well?"},
    ]
    with pytest.raises(openai.BadRequestError) as refused:
        oclient.chat.completions.create(model="m", messages=unanswered)  # type: ignore[arg-type]
    assert "must be followed by tool messages" in str(refused.value)
    assert openai_server.invalid and openai_server.pending == 1


def test_a_strict_fake_refuses_a_call_the_request_did_not_offer(openai_server, anthropic_server):
    tool = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}
    oclient = openai.OpenAI(api_key="sk", base_url=openai_server.base_url, max_retries=0)
    openai_server.script(Reply(calls=[Call("delete_all")]), Reply(calls=[Call("lookup")]))
    with pytest.raises(openai.BadRequestError) as refused:
        oclient.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "go"}], tools=[tool]
        )
    assert "delete_all, which the request does not offer (offered: lookup)" in str(refused.value)
    assert openai_server.violations == [
        "request 1: the script calls delete_all, which the request does not offer (offered: lookup)"
    ]
    openai_server.violations.clear()  # seen here: the fixture's teardown would fail the test
    answered = oclient.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "go"}],
        tools=[tool],
        tool_choice="required",
    )
    assert answered.choices[0].message.tool_calls[0].function.name == "lookup"  # type: ignore[index]

    aclient = anthropic.Anthropic(api_key="ak", base_url=anthropic_server.base_url, max_retries=0)
    anthropic_server.script(Reply(calls=[Call("lookup"), Call("lookup")]))
    with pytest.raises(anthropic.BadRequestError, match="parallel tool calls are off"):
        aclient.messages.create(
            model="m",
            max_tokens=10,
            messages=[{"role": "user", "content": "go"}],
            tools=[{"name": "lookup", "input_schema": {"type": "object"}}],
            tool_choice={"type": "auto", "disable_parallel_tool_use": True},
        )
    assert len(anthropic_server.violations) == 1
    anthropic_server.violations.clear()


@pytest.mark.parametrize(
    ("tool_choice", "reply", "problem"),
    [
        ("none", Reply(calls=[Call("lookup")]), "tool_choice is 'none'"),
        ("required", Reply(text="no"), "tool_choice forces a call (required)"),
        (
            {"type": "function", "function": {"name": "lookup"}},
            Reply(calls=[Call("other")]),
            "tool_choice names lookup but the script calls other",
        ),
    ],
)
def test_a_strict_fake_holds_the_script_to_tool_choice(openai_server, tool_choice, reply, problem):
    tools = [
        {"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
        for n in ("lookup", "other")
    ]
    openai_server.script(reply)
    client = openai.OpenAI(api_key="sk", base_url=openai_server.base_url, max_retries=0)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "go"}],
            tools=tools,
            tool_choice=tool_choice,
        )
    assert len(openai_server.violations) == 1 and problem in openai_server.violations[0]
    openai_server.violations.clear()


def test_a_fake_with_strict_off_sends_what_the_script_says(openai_server):
    openai_server.strict = False  # how a test shows the platform surviving an unknown tool
    openai_server.script(Reply(calls=[Call("delete_all")]))
    client = openai.OpenAI(api_key="sk", base_url=openai_server.base_url, max_retries=0)
    completion = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "go"}]
    )
    assert completion.choices[0].message.tool_calls[0].function.name == "delete_all"  # type: ignore[index]


@pytest.mark.parametrize(
    ("api", "extra", "problem"),
    [
        ("openai", {"tool_choice": "required"}, "tool_choice: only allowed when tools are specified"),
        ("openai", {"parallel_tool_calls": False}, "parallel_tool_calls: only allowed when tools"),
        ("openai", {"tools": [{"type": "function", "function": {"name": "a.b"}}]}, "function.name"),
        (
            "openai",
            {"tools": [{"type": "function", "function": {"name": "a", "parameters": {}}}],
             "tool_choice": {"type": "function", "function": {"name": "b"}}},
            "no tool named 'b'",
        ),
        ("anthropic", {"tools": [{"name": "a", "input_schema": {}}]}, "input_schema.type"),
        ("anthropic", {"tool_choice": {"type": "any"}}, "while providing tools"),
    ],
)  # fmt: skip
def test_the_fakes_check_tool_definitions_and_tool_choice(
    openai_server, anthropic_server, api, extra, problem
):
    server = openai_server if api == "openai" else anthropic_server
    body = {
        "model": "m",
        "max_tokens": 10,
        "messages": [{"role": "user", "content": "go"}],
        **extra,
    }
    path = "/chat/completions" if api == "openai" else "/v1/messages"
    response = httpx.post(server.base_url + path, json=body)
    assert response.status_code == 400
    assert problem in response.json()["error"]["message"]
