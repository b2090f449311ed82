"""The per-endpoint circuit breaker in Redis, alone and in front of a real (fake) model server."""

import time

import pytest

from engine.model.calls import call_model
from llm.types import ChatMessage, ChatRequest
from record.models import ModelEndpoint
from runtime.breaker import CircuitBreaker, model_breaker
from tests.factories import AgentFactory, ModelEndpointFactory, SessionFactory, UserFactory
from tests.fakes.model_servers import FakeModelServer, Reply

from .conftest import KEY_ENV

HELLO = ChatRequest(messages=(ChatMessage(role="user", content="hi"),))


@pytest.fixture
def breaker(unique: str) -> CircuitBreaker:
    return CircuitBreaker(f"test-{unique}", threshold=3, cooldown_s=0.4)


def test_closed_until_threshold_consecutive_failures(breaker):
    assert breaker.state("ep").state == "closed" and breaker.allow("ep")
    breaker.record_failure("ep")
    breaker.record_failure("ep")
    assert breaker.state("ep") == breaker.state("ep") and breaker.state("ep").state == "closed"
    assert breaker.state("ep").failures == 2 and breaker.allow("ep")
    breaker.record_failure("ep")
    state = breaker.state("ep")
    assert state.state == "open" and state.failures == 3 and state.open_until > time.time()
    assert not breaker.allow("ep") and not breaker.allow("ep")


def test_a_success_resets_the_count(breaker):
    breaker.record_failure("ep")
    breaker.record_failure("ep")
    breaker.record_success("ep")
    breaker.record_failure("ep")
    breaker.record_failure("ep")
    assert breaker.state("ep").state == "closed" and breaker.allow("ep")


def test_half_open_after_the_cool_down_lets_exactly_one_trial_through(breaker):
    for _ in range(3):
        breaker.record_failure("ep")
    time.sleep(0.45)
    assert breaker.state("ep").state == "half_open"
    assert [breaker.allow("ep") for _ in range(4)] == [True, False, False, False]


def test_a_successful_trial_closes_the_breaker(breaker):
    for _ in range(3):
        breaker.record_failure("ep")
    time.sleep(0.45)
    assert breaker.allow("ep")
    breaker.record_success("ep")
    assert breaker.state("ep").state == "closed" and breaker.state("ep").failures == 0
    assert breaker.allow("ep") and breaker.allow("ep")


def test_a_failed_trial_opens_it_again_for_a_full_cool_down(breaker):
    for _ in range(3):
        breaker.record_failure("ep")
    time.sleep(0.45)
    assert breaker.allow("ep")
    breaker.record_failure("ep")
    assert breaker.state("ep").state == "open" and not breaker.allow("ep")
    time.sleep(0.45)
    assert breaker.allow("ep")  # a new trial after the new cool-down


def test_a_rate_limit_with_retry_after_opens_at_once_for_at_least_that_long(breaker):
    breaker.record_failure("ep", retry_after_s=2.0)
    state = breaker.state("ep")
    assert state.state == "open" and state.open_until - time.time() > 1.5


def test_endpoints_are_independent(breaker):
    for _ in range(3):
        breaker.record_failure("a")
    assert (
        breaker.state("a").state == "open"
        and breaker.state("b").state == "closed"
        and breaker.allow("b")
    )


def test_reset(breaker):
    for _ in range(3):
        breaker.record_failure("ep")
    breaker.reset("ep")
    assert breaker.state("ep").state == "closed" and breaker.allow("ep")


def test_model_breaker_reads_settings_at_call_time(settings):
    settings.MODEL_BREAKER_THRESHOLD = 2
    settings.MODEL_BREAKER_COOLDOWN_S = 0.25
    assert (model_breaker().threshold, model_breaker().cooldown_s) == (2, 0.25)
    settings.MODEL_BREAKER_THRESHOLD = 7
    assert model_breaker().threshold == 7


# In front of a real server -------------------------------------------------------------


@pytest.fixture
def endpoint(db, openai_server: FakeModelServer, unique: str, api_key) -> ModelEndpoint:  # type: ignore[no-untyped-def]
    endpoint: ModelEndpoint = ModelEndpointFactory(
        name=f"brk-{unique}",
        api="openai",
        base_url=openai_server.base_url,
        model="m",
        api_key_env=KEY_ENV,
        first_token_timeout_s=2,
        total_timeout_s=5,
    )
    return endpoint


def _session(endpoint: ModelEndpoint):  # type: ignore[no-untyped-def]
    agent = AgentFactory(slug=f"agent-{endpoint.name}", model=endpoint, fallback_model=None)
    return SessionFactory(agent=agent, owner=UserFactory(username=f"u-{endpoint.name}"))


def test_the_breaker_skips_an_endpoint_after_n_failures_and_closes_after_a_good_trial(
    settings, endpoint, openai_server
):
    settings.MODEL_BREAKER_THRESHOLD = 3
    settings.MODEL_BREAKER_COOLDOWN_S = 0.5
    session = _session(endpoint)
    agent = session.agent
    openai_server.script(*[Reply(status=500) for _ in range(3)])

    outcomes = [call_model(session, agent, HELLO).calls[0].outcome for _ in range(3)]
    assert outcomes == ["unavailable"] * 3
    assert model_breaker().state(endpoint.name).state == "open"

    skipped = call_model(session, agent, HELLO)
    assert skipped.response is None and [c.outcome for c in skipped.calls] == ["breaker_open"]
    assert "cooling down" in skipped.calls[0].error
    assert len(openai_server.requests) == 3  # nothing reached the server

    time.sleep(0.55)
    assert model_breaker().state(endpoint.name).state == "half_open"
    openai_server.script(Reply(text="back again"))
    trial = call_model(session, agent, HELLO)
    assert trial.response is not None and trial.response.text == "back again"
    assert len(openai_server.requests) == 4
    assert model_breaker().state(endpoint.name).state == "closed"


def test_a_failed_trial_reopens_and_keeps_the_server_untouched(settings, endpoint, openai_server):
    settings.MODEL_BREAKER_THRESHOLD = 2
    settings.MODEL_BREAKER_COOLDOWN_S = 0.4
    session = _session(endpoint)
    openai_server.script(Reply(status=502), Reply(status=503), Reply(hang=True))
    call_model(session, session.agent, HELLO)
    call_model(session, session.agent, HELLO)
    time.sleep(0.45)
    # The reopened breaker cools down long enough for the next call to find it open on a
    # loaded machine too (at 0.4 s it could be half-open again and let a fourth request by).
    settings.MODEL_BREAKER_COOLDOWN_S = 30
    endpoint.first_token_timeout_s = 0.3
    trial = call_model(session, session.agent, HELLO)
    assert trial.calls[0].outcome == "timeout"
    assert model_breaker().state(endpoint.name).state == "open"
    assert call_model(session, session.agent, HELLO).calls[0].outcome == "breaker_open"
    assert len(openai_server.requests) == 3


def test_config_errors_do_not_trip_the_breaker(settings, endpoint, openai_server):
    settings.MODEL_BREAKER_THRESHOLD = 2
    session = _session(endpoint)
    openai_server.script(Reply(status=400), Reply(status=400), Reply(status=400))
    for _ in range(3):
        assert call_model(session, session.agent, HELLO).calls[0].outcome == "bad_request"
    assert model_breaker().state(endpoint.name).state == "closed"
    assert len(openai_server.requests) == 3


def test_a_429_with_retry_after_opens_the_breaker_at_once(settings, endpoint, openai_server):
    settings.MODEL_BREAKER_THRESHOLD = 5
    settings.MODEL_BREAKER_COOLDOWN_S = 0.2
    session = _session(endpoint)
    openai_server.script(Reply(status=429, headers={"Retry-After": "2"}))
    first = call_model(session, session.agent, HELLO)
    assert first.calls[0].outcome == "rate_limited"
    state = model_breaker().state(endpoint.name)
    assert state.state == "open" and state.open_until - time.time() > 1.5
    assert call_model(session, session.agent, HELLO).calls[0].outcome == "breaker_open"
    assert len(openai_server.requests) == 1
