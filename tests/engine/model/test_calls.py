"""engine/model/calls.py: an instant model (the offline rules model) is
called on the engine thread; one that waits goes to the shared io loop."""

import uuid
from collections.abc import Coroutine
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.layers import get_channel_layer
from django.db import connection

from engine import session_run
from engine.model.calls import call_model
from llm.types import ChatMessage, ChatRequest
from record.models import Message, ModelEndpoint
from record.publisher import frames_of, group_name
from runtime import io_loop
from runtime.breaker import model_breaker
from sessions.services import message_post
from tests.factories import AgentFactory, ModelEndpointFactory
from tests.fakes.model_servers import FakeModelServer, Reply
from tests.llm.conftest import KEY_ENV

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def submitted(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    names: list[str] = []
    original = io_loop.submit

    def submit(coro: Coroutine[Any, Any, Any]) -> Any:
        names.append(coro.__qualname__)
        return original(coro)

    monkeypatch.setattr(io_loop, "submit", submit)
    return names


@pytest.mark.parametrize(("options", "hops"), [({}, 0), ({"latency_s": 0.01}, 1)])
def test_only_a_model_that_waits_is_called_on_the_io_loop(make_session, submitted, options, hops):
    model = ModelEndpointFactory(name=f"rules-{hops}", api="rules", options=options)
    agent = AgentFactory(model=model, rules=[{"answer": "Hello there, how are you today?"}])
    session = make_session(agent=agent)

    async def turn() -> list[dict[str, Any]]:
        layer = get_channel_layer()
        channel = await layer.new_channel()
        await layer.group_add(group_name(session.pk), channel)
        try:

            def run() -> None:
                message_post(session=session, content="hi")
                assert session_run(session_id=session.pk).stopped == "idle"

            await sync_to_async(run, thread_sensitive=False)()
            frames = []
            while not any(f["type"] == "turn.finished" for f in frames):
                frames += [dict(f) for f in frames_of(await layer.receive(channel))]
            return frames
        finally:
            await layer.group_discard(group_name(session.pk), channel)

    frames = async_to_sync(turn)()

    assert len([n for n in submitted if n.endswith("_stream.<locals>.call")]) == hops
    # Either way the answer is streamed (batched deltas) and stored whole.
    deltas = "".join(f["data"]["text"] for f in frames if f["type"] == "message.delta")
    assert deltas == "Hello there, how are you today?"
    assert Message.objects.filter(session=session, role="assistant").get().content == deltas


@pytest.mark.parametrize(("options", "held"), [({}, True), ({"latency_s": 0.01}, False)])
def test_only_a_model_that_waits_is_called_without_a_database_connection(
    make_session, monkeypatch, options, held
):
    """A pooled connection is never held across a call that waits on the network;
    the instant one keeps it for the step's commit right after."""
    held_at_call: list[bool] = []
    original_submit, original_inline = io_loop.submit, io_loop.run_inline

    def submit(coro: Coroutine[Any, Any, Any]) -> Any:
        if coro.__qualname__.endswith("_stream.<locals>.call"):
            held_at_call.append(connection.connection is not None)
        return original_submit(coro)

    def run_inline(coro: Coroutine[Any, Any, Any]) -> Any:
        held_at_call.append(connection.connection is not None)
        return original_inline(coro)

    monkeypatch.setattr(io_loop, "submit", submit)
    monkeypatch.setattr(io_loop, "run_inline", run_inline)
    model = ModelEndpointFactory(name=f"rules-held-{held}", api="rules", options=options)
    agent = AgentFactory(model=model, rules=[{"answer": "Hello"}])
    session = make_session(agent=agent)
    message_post(session=session, content="hi")
    assert session_run(session_id=session.pk).stopped == "idle"
    assert held_at_call == [held]


# retry policies of model endpoints (runtime/retry.py) -------------------------------------

HELLO = ChatRequest(messages=(ChatMessage(role="user", content="hi"),))


def _endpoint(server: FakeModelServer, **fields: Any) -> ModelEndpoint:
    endpoint: ModelEndpoint = ModelEndpointFactory(
        name=f"retrying-{uuid.uuid4().hex[:8]}",
        api="openai",
        base_url=server.base_url,
        model="fake-model-1",
        api_key_env=KEY_ENV,
        **fields,
    )
    return endpoint


def test_an_endpoint_is_retried_by_its_policy_after_a_503_and_a_429_then_answers(
    make_session, openai_server, api_key
):
    endpoint = _endpoint(
        openai_server, retry={"attempts": 3, "backoff_base_s": 0.01, "backoff_max_s": 0.02}
    )
    session = make_session(agent=AgentFactory(model=endpoint))
    openai_server.script(
        Reply(status=503, error_message="overloaded"),
        Reply(status=429, error_message="slow down", headers={"Retry-After": "0"}),
        Reply(text="hello"),
    )
    routed = call_model(session, session.agent, HELLO)

    assert routed.response is not None and routed.response.text == "hello"
    assert len(openai_server.requests) == 3
    assert [c.outcome for c in routed.calls] == ["unavailable", "rate_limited", "success"]
    assert [c.retried for c in routed.calls] == [False, True, True]
    assert model_breaker().state(endpoint.name).failures == 0  # it recovered: no outage


def test_an_endpoint_without_a_policy_is_tried_once_and_a_long_retry_after_goes_to_the_fallback(
    make_session, openai_server, api_key
):
    plain = _endpoint(openai_server)
    session = make_session(agent=AgentFactory(model=plain))
    openai_server.script(Reply(status=503, error_message="overloaded"))
    assert call_model(session, session.agent, HELLO).response is None
    assert len(openai_server.requests) == 1

    # Retry-After beyond the policy's cap: not waited for in the worker; the fallback answers.
    patient = _endpoint(openai_server, retry={"attempts": 3, "retry_after_max_s": 30})
    fallback = _endpoint(openai_server)
    agent = AgentFactory(model=patient, fallback_model=fallback)
    session = make_session(agent=agent)
    openai_server.script(
        Reply(status=429, error_message="later", headers={"Retry-After": "120"}),
        Reply(text="from the fallback"),
    )
    routed = call_model(session, agent, HELLO)
    assert routed.response is not None and routed.endpoint == fallback
    assert len(openai_server.requests) == 3
    assert [(c.endpoint_name, c.outcome) for c in routed.calls] == [
        (patient.name, "rate_limited"),
        (fallback.name, "success"),
    ]
