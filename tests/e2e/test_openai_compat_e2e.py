"""The OpenAI-compatible endpoint on the live stack, driven by the official `openai` SDK:
answers with usage, streamed and not; X-Session-Id continues a session and a new one is
seeded with the request's history; the models list; errors in OpenAI's shape with OpenAI's
statuses; an ask_user or approval pause ends the request instead of hanging; a client that
goes away cancels its turn."""

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from django.conf import settings
from django.contrib.auth.models import User
from pydantic import BaseModel

from billing.services import account_ensure
from record.models import Message, ModelEndpoint, Session
from tests.factories import AgentFactory, ModelEndpointFactory, ToolFactory, api_key_for
from tests.fakes.fixtures import fake_servers, openai_server  # noqa: F401 - fixtures
from tests.fakes.model_servers import Call, FakeModelServer, Reply
from tests.stack import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def _client(stack: Stack, key: str) -> openai.OpenAI:
    # No retries: a refused request must show its own status, not a retried one's.
    return openai.OpenAI(base_url=f"{stack.http}/openai/v1", api_key=key, max_retries=0, timeout=60)


def _echo_agent() -> str:
    slug = f"echo-{uuid.uuid4().hex[:8]}"
    AgentFactory(
        slug=slug,
        model=ModelEndpointFactory(name="rules", api="rules", options={}),
        rules=[{"answer": "Echo: {{ user }}"}],
    )
    return slug


@pytest.fixture
def key() -> str:
    return api_key_for(f"oa-{uuid.uuid4().hex[:8]}")


@pytest.fixture
def fake_agent(openai_server: FakeModelServer) -> Iterator[str]:  # noqa: F811
    endpoint = ModelEndpoint.objects.create(
        name=f"oa-fake-{uuid.uuid4().hex[:8]}",
        api="openai",
        base_url=openai_server.base_url,
        model="fake-model",
        first_token_timeout_s=5,
        total_timeout_s=20,
    )
    slug = f"fake-{uuid.uuid4().hex[:8]}"
    AgentFactory(slug=slug, model=endpoint)
    yield slug


def test_a_completion_is_the_agents_answer_with_usage_and_a_session(live_stack, key):
    slug = _echo_agent()
    client = _client(live_stack, key)
    raw = client.chat.completions.with_raw_response.create(
        model=slug, messages=[{"role": "user", "content": "hello there"}]
    )
    completion = raw.parse()
    session_id = raw.headers["X-Session-Id"]
    choice = completion.choices[0]
    assert (choice.message.role, choice.message.content) == ("assistant", "Echo: hello there")
    assert choice.finish_reason == "stop"
    assert completion.object == "chat.completion" and completion.model == slug
    session = Session.objects.get(pk=session_id)
    # No X-Session-Id: a stateless request, its session ephemeral (pruned once idle).
    assert session.ephemeral
    assert completion.usage is not None
    assert completion.usage.prompt_tokens == session.input_tokens > 0
    assert completion.usage.completion_tokens == session.output_tokens > 0
    assert completion.usage.total_tokens == session.input_tokens + session.output_tokens
    extension = _ext(completion)
    assert extension == {"session_id": session_id, "status": "finished", "stop_reason": "answer"}


def test_streaming_sends_role_then_deltas_then_finish_usage_and_done(
    live_stack,
    key,
    fake_agent,
    openai_server,  # noqa: F811
):
    openai_server.script(Reply(text="The parcel left the depot this morning.", usage=(42, 9)))
    client = _client(live_stack, key)
    with client.chat.completions.create(
        model=fake_agent,
        messages=[{"role": "user", "content": "where is my parcel?"}],
        stream=True,
        stream_options={"include_usage": True},
    ) as stream:
        chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    texts = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    # The fake model sends the answer word by word: it arrives in more than one piece.
    assert len(texts) > 1, texts
    assert "".join(texts) == "The parcel left the depot this morning."
    finished = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert [c.choices[0].finish_reason for c in finished] == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    usage = chunks[-1].usage
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (42, 9, 51)
    assert all(c.usage is None for c in chunks[:-1])
    assert len({c.id for c in chunks}) == 1


def test_the_raw_stream_is_openai_sse_ending_with_done(live_stack, key):
    slug = _echo_agent()
    with httpx.stream(
        "POST",
        f"{live_stack.http}/openai/v1/chat/completions",
        headers={"Authorization": f"Bearer {key}"},
        json={"model": slug, "stream": True, "messages": [{"role": "user", "content": "hi"}]},
        timeout=30,
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["x-session-id"]
        lines = [line for line in response.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    assert all(line.startswith("data: ") for line in lines)


def test_x_session_id_continues_the_session_and_a_new_one_is_seeded_with_history(live_stack, key):
    slug = _echo_agent()
    client = _client(live_stack, key)
    raw = client.chat.completions.with_raw_response.create(
        model=slug,
        messages=[
            {"role": "system", "content": "You are a pirate."},
            {"role": "user", "content": "my name is Ada"},
            {"role": "assistant", "content": "Hello Ada"},
            {"role": "user", "content": [{"type": "text", "text": "what is my name?"}]},
        ],
    )
    session_id = raw.headers["X-Session-Id"]
    assert raw.parse().choices[0].message.content == "Echo: what is my name?"
    again = client.chat.completions.with_raw_response.create(
        model=slug,
        # Earlier messages of a continued session are the session's own: these are ignored.
        messages=[{"role": "user", "content": "ignored"}, {"role": "user", "content": "second"}],
        extra_headers={"X-Session-Id": session_id},
    )
    assert again.headers["X-Session-Id"] == session_id
    assert again.parse().choices[0].message.content == "Echo: second"
    history = list(
        Message.objects.filter(session_id=session_id, status="final")
        .order_by("seq")
        .values_list("role", "content")
    )
    assert history == [
        ("user", "my name is Ada"),
        ("assistant", "Hello Ada"),
        ("user", "what is my name?"),
        ("assistant", "Echo: what is my name?"),
        ("user", "second"),
        ("assistant", "Echo: second"),
    ]


def test_the_models_are_the_agents(live_stack, key):
    slug = _echo_agent()
    client = _client(live_stack, key)
    models = {m.id: m for m in client.models.list()}
    assert slug in models and models[slug].object == "model"
    assert client.models.retrieve(slug).id == slug
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-agent")


def _ext(obj: Any) -> dict[str, Any]:
    """The `agentplatform` key of a completion or chunk."""
    return dict((obj.model_extra or {})["agentplatform"])


def _error(exc: openai.APIStatusError) -> dict[str, Any]:
    body = exc.response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return dict(body["error"])


def test_errors_come_in_openais_shape_with_openais_statuses(live_stack, key):
    slug = _echo_agent()
    client = _client(live_stack, key)
    user: Any = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.AuthenticationError) as bad_key:
        _client(live_stack, "ap_not-a-key").chat.completions.create(model=slug, messages=user)
    assert _error(bad_key.value)["code"] == "invalid_api_key"
    with pytest.raises(openai.NotFoundError) as no_model:
        client.chat.completions.create(model="no-such-agent", messages=user)
    assert _error(no_model.value)["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model=slug, messages=[{"role": "assistant", "content": "x"}])
    assert _error(bad.value) | {"message": ""} == {
        "message": "",
        "type": "invalid_request_error",
        "param": "messages",
        "code": "invalid_request",
    }
    with pytest.raises(openai.NotFoundError) as no_session:
        client.chat.completions.create(
            model=slug, messages=user, extra_headers={"X-Session-Id": str(uuid.uuid4())}
        )
    assert _error(no_session.value)["code"] == "session_not_found"
    # Another owner's session is missing too.
    raw = client.chat.completions.with_raw_response.create(model=slug, messages=user)
    other = _client(live_stack, api_key_for(f"other-{uuid.uuid4().hex[:6]}"))
    with pytest.raises(openai.NotFoundError):
        other.chat.completions.create(
            model=slug, messages=user, extra_headers={"X-Session-Id": raw.headers["X-Session-Id"]}
        )
    response = httpx.post(
        f"{live_stack.http}/openai/v1/chat/completions",
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        content=b"{not json",
    )
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_json"


def test_an_owner_without_credits_gets_429_insufficient_quota(live_stack):
    slug = _echo_agent()
    name = f"broke-{uuid.uuid4().hex[:8]}"
    client = _client(live_stack, api_key_for(name))
    owner_id = User.objects.get(username=name).pk
    account_ensure(owner_id=owner_id)  # an account with no points
    with pytest.raises(openai.RateLimitError) as refused:
        client.chat.completions.create(model=slug, messages=[{"role": "user", "content": "hi"}])
    assert _error(refused.value)["type"] == "insufficient_quota"
    assert not Session.objects.filter(owner_id=owner_id).exists()


def _asking_agent() -> str:
    slug = f"asking-{uuid.uuid4().hex[:8]}"
    AgentFactory(
        slug=slug,
        model=ModelEndpointFactory(name="rules", api="rules", options={}),
        tools=["ask_user"],
        rules=[
            {"when": {"user": "^book", "last_tool": None},
             "tool_calls": [{"tool": "ask_user", "args": {"question": "Which day?", "options": ["Mon", "Tue"]}}]},
            {"when": {"last_tool": "ask_user"}, "answer": "Booked for {{ result.answer }}"},
            {"answer": "?"},
        ],
    )  # fmt: skip
    return slug


def test_an_ask_user_pause_ends_the_request_and_the_next_one_answers_it(live_stack, key):
    slug = _asking_agent()
    client = _client(live_stack, key)
    started = time.monotonic()
    raw = client.chat.completions.with_raw_response.create(
        model=slug, messages=[{"role": "user", "content": "book a table"}]
    )
    asked = raw.parse()
    assert time.monotonic() - started < 30
    session_id = raw.headers["X-Session-Id"]
    assert asked.choices[0].finish_reason == "stop"
    assert asked.choices[0].message.content == "Which day? (options: Mon, Tue)"
    assert _ext(asked) == {
        "session_id": session_id,
        "status": "awaiting_user",
        "question": "Which day?",
        "options": ["Mon", "Tue"],
    }
    # The answer, streamed: the same turn goes on.
    with client.chat.completions.create(
        model=slug,
        messages=[{"role": "user", "content": "Tue"}],
        stream=True,
        extra_headers={"X-Session-Id": session_id},
    ) as stream:
        chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Booked for Tue"
    finish = next(c for c in chunks if c.choices and c.choices[0].finish_reason)
    assert _ext(finish)["status"] == "finished"
    assert Session.objects.get(pk=session_id).turn == 1


def test_an_approval_pause_ends_the_request_and_the_session_is_busy_until_decided(live_stack, key):
    ToolFactory(
        name="stamp",
        handler="builtin.current_time",
        side_effects=True,
        requires_approval=True,
        parameters={"type": "object", "properties": {}},
    )
    slug = f"approving-{uuid.uuid4().hex[:8]}"
    AgentFactory(
        slug=slug,
        model=ModelEndpointFactory(name="rules", api="rules", options={}),
        tools=["stamp"],
        rules=[
            {"when": {"last_tool": "stamp"}, "answer": "Stamped"},
            {"when": {"user": "stamp", "last_tool": None}, "tool_calls": [{"tool": "stamp", "args": {}}]},
            {"answer": "?"},
        ],
    )  # fmt: skip
    client = _client(live_stack, key)
    with client.chat.completions.create(
        model=slug, messages=[{"role": "user", "content": "stamp it"}], stream=True
    ) as stream:
        chunks = list(stream)
    finish = next(c for c in chunks if c.choices and c.choices[0].finish_reason)
    extension = _ext(finish)
    assert finish.choices[0].finish_reason == "stop"
    assert extension["status"] == "awaiting_approval" and extension["approval_id"]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "Waiting for approval of stamp" in text
    session_id = extension["session_id"]
    assert Session.objects.get(pk=session_id).state == "awaiting_approval"
    with pytest.raises(openai.InternalServerError) as busy:
        client.chat.completions.create(
            model=slug,
            messages=[{"role": "user", "content": "again"}],
            extra_headers={"X-Session-Id": session_id},
        )
    assert busy.value.status_code == 503
    assert _error(busy.value)["code"] == "session_busy"
    assert busy.value.response.headers["Retry-After"]


def test_a_client_that_goes_away_cancels_its_turn(
    live_stack,
    key,
    fake_agent,
    openai_server,  # noqa: F811
):
    # Slow enough that the client leaves while the model is still answering.
    openai_server.script(Reply(text="one two three four five six seven eight", delay_s=1.0))
    with httpx.stream(
        "POST",
        f"{live_stack.http}/openai/v1/chat/completions",
        headers={"Authorization": f"Bearer {key}"},
        json={
            "model": fake_agent,
            "stream": True,
            "messages": [{"role": "user", "content": "count slowly"}],
        },
        timeout=30,
    ) as response:
        session_id = response.headers["x-session-id"]
        for line in response.iter_lines():
            if '"content": "one' in line or '"content":"one' in line:
                break
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if Session.objects.get(pk=session_id).state == "cancelled":
            break
        time.sleep(0.2)
    session = Session.objects.get(pk=session_id)
    assert session.state == "cancelled", live_stack.log_tail("worker")


# A failure is never a 200 -----------------------------------------------------------------


def _failing_agent(openai_server: FakeModelServer, busy: str = "BUSY-MESSAGE") -> str:  # noqa: F811
    endpoint = ModelEndpoint.objects.create(
        name=f"oa-failing-{uuid.uuid4().hex[:8]}",
        api="openai",
        base_url=openai_server.base_url,
        model="fake-model",
        first_token_timeout_s=5,
        total_timeout_s=20,
    )
    slug = f"failing-{uuid.uuid4().hex[:8]}"
    AgentFactory(slug=slug, model=endpoint, busy_message=busy)
    return slug


HI: Any = [{"role": "user", "content": "hi"}]


def test_a_provider_that_refuses_is_a_502_model_refused_not_the_busy_message(
    live_stack,
    key,
    openai_server,  # noqa: F811
):
    slug = _failing_agent(openai_server)
    openai_server.script(Reply(status=401, error_message="Incorrect API key provided"))
    with pytest.raises(openai.InternalServerError) as failed:
        _client(live_stack, key).chat.completions.create(model=slug, messages=HI)
    assert failed.value.status_code == 502
    error = _error(failed.value)
    assert (error["type"], error["code"]) == ("server_error", "model_refused")
    assert "Incorrect API key provided" in error["message"]
    assert "BUSY-MESSAGE" not in failed.value.response.text
    assert failed.value.response.headers["X-Session-Id"]


def test_an_outage_is_a_502_model_unavailable_streamed_or_not(
    live_stack,
    key,
    openai_server,  # noqa: F811
):
    slug = _failing_agent(openai_server)
    client = _client(live_stack, key)
    openai_server.script(Reply(status=500), Reply(status=500))
    with pytest.raises(openai.InternalServerError) as failed:
        client.chat.completions.create(model=slug, messages=HI)
    assert (failed.value.status_code, _error(failed.value)["code"]) == (502, "model_unavailable")
    # Streamed: it failed before any text, so the status says so (the SDK raises at create).
    openai_server.script(Reply(status=500), Reply(status=500))
    with pytest.raises(openai.InternalServerError) as streamed:
        client.chat.completions.create(model=slug, messages=HI, stream=True)
    assert (streamed.value.status_code, _error(streamed.value)["code"]) == (
        502,
        "model_unavailable",
    )


def test_a_rate_limited_model_is_a_503_with_retry_after(
    live_stack,
    key,
    openai_server,  # noqa: F811
):
    slug = _failing_agent(openai_server)
    openai_server.script(Reply(status=429, headers={"Retry-After": "7"}))
    with pytest.raises(openai.InternalServerError) as busy:
        _client(live_stack, key).chat.completions.create(model=slug, messages=HI)
    assert busy.value.status_code == 503
    assert _error(busy.value)["code"] == "model_overloaded"
    # When the model's breaker (opened for the provider's Retry-After, at least its cool-down)
    # lets calls through again.
    cooldown = max(7, settings.MODEL_BREAKER_COOLDOWN_S)
    assert cooldown - 5 <= int(busy.value.response.headers["Retry-After"]) <= cooldown


def test_a_failure_once_the_stream_has_started_is_an_error_chunk_the_sdk_raises(
    live_stack,
    key,
    openai_server,  # noqa: F811
):
    slug = _failing_agent(openai_server)
    # Three words arrive, then the provider drops the connection: no fallback answers.
    openai_server.script(Reply(text="one two three four five six", delay_s=0.4, cut_after=4))
    client = _client(live_stack, key)
    texts: list[str] = []
    with pytest.raises(openai.APIError) as failed:  # noqa: PT012 - the chunks before it count
        for chunk in client.chat.completions.create(model=slug, messages=HI, stream=True):
            if chunk.choices and chunk.choices[0].delta.content:
                texts.append(chunk.choices[0].delta.content)
    assert not isinstance(failed.value, openai.APIStatusError)  # the status was a 200
    assert failed.value.body == {
        "message": failed.value.message,
        "type": "server_error",
        "param": None,
        "code": "model_unavailable",
    }
    assert "".join(texts).startswith("one")
    assert "BUSY-MESSAGE" not in "".join(texts)


def test_the_raw_error_chunk_is_openais_error_shape_and_no_done_follows(
    live_stack,
    key,
    openai_server,  # noqa: F811
):
    slug = _failing_agent(openai_server)
    openai_server.script(Reply(text="one two three four five six", delay_s=0.4, cut_after=4))
    with httpx.stream(
        "POST",
        f"{live_stack.http}/openai/v1/chat/completions",
        headers={"Authorization": f"Bearer {key}"},
        json={"model": slug, "stream": True, "messages": HI},
        timeout=30,
    ) as response:
        assert response.status_code == 200
        lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert "data: [DONE]" not in lines
    last = json.loads(lines[-1][len("data: ") :])
    assert set(last) == {"error"} and last["error"]["code"] == "model_unavailable"


def test_langchain_and_the_agents_sdk_see_an_exception_not_an_answer(
    live_stack,
    key,
    openai_server,  # noqa: F811
):
    from agents import Agent, OpenAIChatCompletionsModel, Runner, set_tracing_disabled
    from langchain_openai import ChatOpenAI

    slug = _failing_agent(openai_server)
    base = f"{live_stack.http}/openai/v1"
    openai_server.script(*[Reply(status=401)] * 4)
    chat = ChatOpenAI(model=slug, base_url=base, api_key=key, max_retries=0)
    with pytest.raises(openai.InternalServerError):
        chat.invoke("hi")
    with pytest.raises(openai.InternalServerError):
        list(chat.stream("hi"))
    set_tracing_disabled(True)
    model = OpenAIChatCompletionsModel(
        model=slug, openai_client=openai.AsyncOpenAI(base_url=base, api_key=key, max_retries=0)
    )
    with pytest.raises(openai.InternalServerError):
        Runner.run_sync(Agent(name="support", model=model), "hi")


# response_format and the sampling parameters -------------------------------------------------


class City(BaseModel):
    city: str
    population: int


CITY_JSON = '{"city": "Lyon", "population": 522000}'


def test_sampling_and_structured_output_reach_the_model_and_parse_in_the_sdk(
    live_stack,
    key,
    fake_agent,
    openai_server,  # noqa: F811
):
    openai_server.script(Reply(text=CITY_JSON))
    parsed = _client(live_stack, key).chat.completions.parse(
        model=fake_agent,
        messages=[{"role": "user", "content": "the biggest city on the Rhône?"}],
        response_format=City,
        temperature=0.1,
        top_p=0.8,
        max_completion_tokens=300,
        stop=["END"],
        seed=11,
        user="u-1",
        store=False,
        metadata={"app": "tests"},
    )
    assert parsed.choices[0].message.parsed == City(city="Lyon", population=522000)
    body = openai_server.requests[0].body
    assert (body["temperature"], body["top_p"], body["max_tokens"], body["stop"], body["seed"]) == (
        0.1,
        0.8,
        300,
        ["END"],
        11,
    )
    wire = body["response_format"]
    assert wire["type"] == "json_schema" and wire["json_schema"]["name"] == "City"
    assert wire["json_schema"]["strict"] is True
    assert set(wire["json_schema"]["schema"]["required"]) == {"city", "population"}


def _json_agent() -> str:
    """An offline agent whose first answer misses a field; told what is wrong, it repairs it.
    Asked for 'nonsense', it never answers JSON."""
    slug = f"json-{uuid.uuid4().hex[:8]}"
    AgentFactory(
        slug=slug,
        model=ModelEndpointFactory(name="rules", api="rules", options={}),
        rules=[
            {"when": {"user": "^That answer is not valid.*population"}, "answer": CITY_JSON},
            {"when": {"user": "nonsense"}, "answer": "Lyon, probably."},
            {"when": {"user": "^That answer is not valid"}, "answer": "Still Lyon."},
            {"answer": '{"city": "Lyon"}'},
        ],
    )  # fmt: skip
    return slug


def test_an_answer_repaired_once_is_json_streamed_or_not(live_stack, key):
    slug = _json_agent()
    client = _client(live_stack, key)
    messages: Any = [{"role": "user", "content": "the biggest city on the Rhône?"}]
    parsed = client.chat.completions.parse(model=slug, messages=messages, response_format=City)
    assert parsed.choices[0].message.parsed == City(city="Lyon", population=522000)
    with client.chat.completions.stream(
        model=slug, messages=messages, response_format=City
    ) as stream:
        final = stream.get_final_completion()
    assert final.choices[0].message.parsed == City(city="Lyon", population=522000)
    # json_object: any JSON object will do, the first answer stands.
    plain = client.chat.completions.create(
        model=slug, messages=messages, response_format={"type": "json_object"}
    )
    assert json.loads(plain.choices[0].message.content or "") == {"city": "Lyon"}


def test_an_answer_still_invalid_is_a_502_invalid_json(live_stack, key):
    slug = _json_agent()
    client = _client(live_stack, key)
    messages: Any = [{"role": "user", "content": "nonsense"}]
    for stream in (False, True):
        with pytest.raises(openai.InternalServerError) as failed:
            client.chat.completions.create(
                model=slug,
                messages=messages,
                response_format={"type": "json_object"},
                stream=stream,
            )
        error = _error(failed.value)
        assert (failed.value.status_code, error["code"], error["param"]) == (
            502,
            "invalid_json",
            "response_format",
        )
        assert "not JSON" in error["message"]


def test_a_parameter_the_platform_cannot_honour_is_a_400_naming_it(live_stack, key):
    slug = _echo_agent()
    client = _client(live_stack, key)
    for extra, param in (
        ({"logprobs": True}, "logprobs"),
        ({"n": 2}, "n"),
        ({"reasoning_effort": "high"}, "reasoning_effort"),
        ({"extra_body": {"frobnicate": 1}}, "frobnicate"),
    ):
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(model=slug, messages=HI, **extra)
        error = _error(refused.value)
        assert (error["type"], error["param"]) == ("invalid_request_error", param)
    # The harmless defaults the SDKs send pass.
    client.chat.completions.create(
        model=slug, messages=HI, n=1, parallel_tool_calls=True, tool_choice="auto", logprobs=False
    )


def test_the_agents_sdk_and_langchain_get_structured_output(
    live_stack,
    key,
    fake_agent,
    openai_server,  # noqa: F811
):
    from agents import Agent, OpenAIChatCompletionsModel, Runner, set_tracing_disabled
    from langchain_openai import ChatOpenAI

    base = f"{live_stack.http}/openai/v1"
    set_tracing_disabled(True)
    model = OpenAIChatCompletionsModel(
        model=fake_agent,
        openai_client=openai.AsyncOpenAI(base_url=base, api_key=key, max_retries=0),
    )
    openai_server.script(*[Reply(text=CITY_JSON)] * 3)
    result = Runner.run_sync(Agent(name="geo", model=model, output_type=City), "Rhône?")
    assert result.final_output == City(city="Lyon", population=522000)
    chat = ChatOpenAI(model=fake_agent, base_url=base, api_key=key, max_retries=0)
    assert chat.with_structured_output(City).invoke("Rhône?") == City(
        city="Lyon", population=522000
    )
    assert chat.with_structured_output(City, method="json_mode").invoke("Rhône? JSON") == City(
        city="Lyon", population=522000
    )
    formats = [r.body["response_format"]["type"] for r in openai_server.requests]
    assert formats == ["json_schema", "json_schema", "json_object"]


def test_langchain_function_calling_structured_output_forces_the_clients_tool(
    live_stack,
    key,
    fake_agent,
    openai_server,  # noqa: F811
):
    """with_structured_output(method="function_calling") offers the schema as a tool, forces
    it (tool_choice) and asks for one call (parallel_tool_calls false): the model's call of
    it comes back as tool_calls, which LangChain parses."""
    from langchain_openai import ChatOpenAI

    openai_server.script(Reply(calls=[Call("City", {"city": "Lyon", "population": 522000})]))
    chat = ChatOpenAI(
        model=fake_agent, base_url=f"{live_stack.http}/openai/v1", api_key=key, max_retries=0
    )
    structured = chat.with_structured_output(City, method="function_calling")
    assert structured.invoke("Rhône?") == City(city="Lyon", population=522000)
    (sent,) = openai_server.requests
    assert sent.body["tool_choice"] == {"type": "function", "function": {"name": "City"}}
    assert sent.body["parallel_tool_calls"] is False
    assert [t["function"]["name"] for t in sent.body["tools"]] == ["City"]


def test_tool_choice_none_and_required_reach_the_model(
    live_stack,
    key,
    fake_agent,
    openai_server,  # noqa: F811
):
    openai_server.script(
        Reply(text="no tool"), Reply(calls=[Call("get_weather", {"city": "Oslo"})])
    )
    client = _client(live_stack, key)
    answered = client.chat.completions.create(
        model=fake_agent, messages=HI, tools=[WEATHER_TOOL], tool_choice="none"
    )
    assert answered.choices[0].message.content == "no tool"
    forced = client.chat.completions.create(
        model=fake_agent, messages=HI, tools=[WEATHER_TOOL], tool_choice="required"
    )
    assert forced.choices[0].finish_reason == "tool_calls"
    assert [r.body["tool_choice"] for r in openai_server.requests] == ["none", "required"]


def test_after_a_handoff_the_response_names_the_agent_answering_and_the_session_goes_on(
    live_stack, key
):
    """A triage agent with only handoffs is offered its transfer (the strict rules model
    calls nothing else), hands over, and the response's `model` is the agent that answered;
    the client's next request, still naming the first agent, goes on with the session."""
    model = ModelEndpointFactory(name="rules", api="rules", options={})
    tag = uuid.uuid4().hex[:6]
    billing, triage = f"billing-{tag}", f"triage-{tag}"
    AgentFactory(slug=billing, model=model, rules=[{"answer": "billing: {{ user }}"}])
    AgentFactory(
        slug=triage,
        model=model,
        handoffs=[billing],
        rules=[{"when": {"user": "invoice", "last_tool": None},
                "tool_calls": [{"tool": f"transfer_to_{billing}", "args": {"reason": "invoices"}}]},
               {"answer": "triage here"}],
    )  # fmt: skip
    client = _client(live_stack, key)
    raw = client.chat.completions.with_raw_response.create(
        model=triage, messages=[{"role": "user", "content": "my invoice"}]
    )
    first = raw.parse()
    session_id = raw.headers["X-Session-Id"]
    assert (first.model, first.choices[0].message.content) == (billing, "billing: my invoice")
    with client.chat.completions.create(
        model=triage,
        messages=[{"role": "user", "content": "and again"}],
        stream=True,
        extra_headers={"X-Session-Id": session_id},
    ) as stream:
        chunks = list(stream)
    assert {c.model for c in chunks} == {billing}
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == (
        "billing: and again"
    )
    stranger = _echo_agent()
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            model=stranger, messages=HI, extra_headers={"X-Session-Id": session_id}
        )
    assert _error(refused.value)["param"] == "model"


# The client's own tools -----------------------------------------------------------------------

WEATHER_TOOL: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def _weather_agent() -> str:
    """Offline: asked about the weather, it calls the client's get_weather, then answers
    with what the client's tool said."""
    slug = f"weather-{uuid.uuid4().hex[:8]}"
    AgentFactory(
        slug=slug,
        model=ModelEndpointFactory(name="rules", api="rules", options={}),
        rules=[
            {"when": {"user": "weather", "last_tool": None},
             "tool_calls": [{"tool": "get_weather", "args": {"city": "Paris"}}]},
            {"when": {"last_tool": "get_weather"}, "answer": "Paris: {{ result.sky }}"},
            {"answer": "?"},
        ],
    )  # fmt: skip
    return slug


def test_a_call_of_the_clients_tool_comes_back_as_tool_calls_and_its_result_resumes_the_turn(
    live_stack, key
):
    slug = _weather_agent()
    client = _client(live_stack, key)
    messages: Any = [{"role": "user", "content": "what is the weather?"}]
    raw = client.chat.completions.with_raw_response.create(
        model=slug, messages=messages, tools=[WEATHER_TOOL]
    )
    asked = raw.parse()
    session_id = raw.headers["X-Session-Id"]
    choice = asked.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls or []
    assert (call.type, call.function.name, json.loads(call.function.arguments)) == (
        "function",
        "get_weather",
        {"city": "Paris"},
    )
    assert _ext(asked) == {"session_id": session_id, "status": "awaiting_tool_results"}
    session = Session.objects.get(pk=session_id)
    assert session.state == "paused_for_user"
    # It never ran here: no result, no tool.finished, until the client's comes.
    row = session.tool_calls.get(call_id=call.id)
    assert (row.client, row.status, row.output) == (True, "executing", None)
    # The client runs it; its result, with the same X-Session-Id, resumes the same turn.
    with client.chat.completions.create(
        model=slug,
        messages=[
            *messages,
            choice.message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": '{"sky": "sunny"}'},
        ],
        tools=[WEATHER_TOOL],
        stream=True,
        extra_headers={"X-Session-Id": session_id},
    ) as stream:
        chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Paris: sunny"
    session.refresh_from_db()
    assert (session.state, session.turn) == ("finished", 1)
    row.refresh_from_db()
    assert (row.status, row.output) == ("success", {"result": '{"sky": "sunny"}'})


def test_client_tools_are_refused_when_they_clash_or_answer_nothing(live_stack, key):
    slug = _asking_agent()  # its own tools: ask_user
    client = _client(live_stack, key)
    clash = {**WEATHER_TOOL, "function": {**WEATHER_TOOL["function"], "name": "ask_user"}}
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=slug, messages=HI, tools=[clash])
    assert _error(refused.value)["param"] == "tools[0].function.name"
    with pytest.raises(openai.BadRequestError) as nothing:
        client.chat.completions.create(
            model=slug,
            messages=[*HI, {"role": "tool", "tool_call_id": "call_nobody", "content": "x"}],
        )
    assert _error(nothing.value)["param"] == "messages"


def test_an_agents_sdk_agent_with_its_own_function_tool_and_the_platforms_tool(
    live_stack,
    key,
    openai_server,  # noqa: F811
):
    """The Agents SDK sends no X-Session-Id: its tool results find the turn that waits for
    them by their call ids. The platform's tool runs on the platform in the same step."""
    from agents import (
        Agent,
        OpenAIChatCompletionsModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )

    ToolFactory(
        name="stamp_time",
        handler="builtin.current_time",
        parameters={"type": "object", "properties": {}},
    )
    endpoint = ModelEndpoint.objects.create(
        name=f"oa-tools-{uuid.uuid4().hex[:8]}",
        api="openai",
        base_url=openai_server.base_url,
        model="fake-model",
        first_token_timeout_s=5,
        total_timeout_s=20,
    )
    slug = f"mixed-{uuid.uuid4().hex[:8]}"
    AgentFactory(slug=slug, model=endpoint, tools=["stamp_time"])
    openai_server.script(
        Reply(calls=[Call("stamp_time", {}), Call("get_weather", {"city": "Paris"})]),
        Reply(text="It is sunny in Paris."),
    )
    ran: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        ran.append(city)
        return "sunny"

    set_tracing_disabled(True)
    model = OpenAIChatCompletionsModel(
        model=slug,
        openai_client=openai.AsyncOpenAI(
            base_url=f"{live_stack.http}/openai/v1", api_key=key, max_retries=0
        ),
    )
    result = Runner.run_sync(
        Agent(name="weather", model=model, tools=[get_weather]), "weather in Paris?"
    )
    assert result.final_output == "It is sunny in Paris."
    assert ran == ["Paris"]
    first, second = openai_server.requests
    offered = {t["function"]["name"] for t in first.body["tools"]}
    assert offered == {"stamp_time", "get_weather"}
    results = {m["tool_call_id"]: m["content"] for m in second.messages if m["role"] == "tool"}
    assert len(results) == 2 and "sunny" in results.values()
    session = Session.objects.get(agent__slug=slug)
    assert session.turn == 1 and session.state == "finished"
    statuses = dict(session.tool_calls.values_list("tool_name", "client"))
    assert statuses == {"stamp_time": False, "get_weather": True}


def test_an_agents_sdk_handoff_between_two_platform_agents_goes_on_in_one_session(
    live_stack,
    key,
    openai_server,  # noqa: F811
):
    """The SDK's `handoffs` between two platform agents: the first agent's model calls the
    SDK's `transfer_to_billing` (a client tool), the SDK sends the conversation to the
    second agent with that call's result; the platform hands its session over (one session,
    an `agent.changed` event) and the second agent answers, named as the response's model.
    A handoff to an agent whose tools the session's role may not use is a 400 that leaves
    the turn waiting."""
    from agents import Agent, OpenAIChatCompletionsModel, Runner, set_tracing_disabled

    endpoint = ModelEndpoint.objects.create(
        name=f"oa-handoff-{uuid.uuid4().hex[:8]}",
        api="openai",
        base_url=openai_server.base_url,
        model="fake-model",
        first_token_timeout_s=5,
        total_timeout_s=20,
    )
    front, billing = (f"{name}-{uuid.uuid4().hex[:8]}" for name in ("front", "billing"))
    AgentFactory(slug=front, model=endpoint)
    AgentFactory(slug=billing, model=endpoint, system_prompt="You handle refunds.")
    openai_server.script(
        Reply(calls=[Call("transfer_to_billing", {})]),
        Reply(text="Your refund is on its way."),
    )
    set_tracing_disabled(True)
    client = openai.AsyncOpenAI(base_url=f"{live_stack.http}/openai/v1", api_key=key)  # retries on

    def model(slug: str) -> OpenAIChatCompletionsModel:
        return OpenAIChatCompletionsModel(model=slug, openai_client=client)

    billing_agent = Agent(name="billing", model=model(billing))
    triage = Agent(name="triage", model=model(front), handoffs=[billing_agent])
    result = Runner.run_sync(triage, "I want my money back")

    assert result.final_output == "Your refund is on its way."
    assert result.last_agent.name == "billing"
    first, second = openai_server.requests
    assert {t["function"]["name"] for t in first.body["tools"]} == {"transfer_to_billing"}
    assert second.messages[0]["content"] == "You handle refunds."  # billing's own prompt
    session = Session.objects.get(agent__slug=billing)
    assert (session.state, session.turn) == ("finished", 1)
    changed = list(session.events.filter(type="agent.changed").values_list("data", flat=True))
    assert [(c["from"], c["to"]) for c in changed] == [(front, billing)]
    assert not Session.objects.filter(agent__slug=front).exists()  # no second session

    # Refused: the role may not use the target's tools; the turn still waits, unchanged.
    locked = f"locked-{uuid.uuid4().hex[:8]}"
    ToolFactory(name=f"wire_{locked}".replace("-", "_"), roles=["finance"])
    AgentFactory(slug=locked, model=endpoint, tools=[f"wire_{locked}".replace("-", "_")])
    openai_server.script(Reply(calls=[Call("transfer_to_locked", {})]))
    plain = _client(live_stack, key)
    hand: Any = {"type": "function", "function": {"name": "transfer_to_locked", "parameters": {}}}
    paused = plain.chat.completions.create(model=front, messages=HI, tools=[hand])
    call = paused.choices[0].message.tool_calls[0]
    waiting = Session.objects.get(pk=paused.model_extra["agentplatform"]["session_id"])
    seq = waiting.event_seq
    with pytest.raises(openai.BadRequestError) as refused:
        plain.chat.completions.create(
            model=locked,
            messages=[
                *HI,
                {"role": "assistant", "tool_calls": [call.model_dump()]},
                {"role": "tool", "tool_call_id": call.id, "content": "{}"},
            ],
        )
    assert _error(refused.value)["param"] == "model"
    assert "may not use its tools" in _error(refused.value)["message"]
    waiting.refresh_from_db()
    assert (waiting.state, waiting.agent.slug, waiting.event_seq) == ("paused_for_user", front, seq)
