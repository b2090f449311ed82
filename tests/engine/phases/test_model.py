"""The model phase's choice of where a step's call goes, and how its request is counted:
the tightest window and the strictest tokenizer of the endpoints the step may call."""

import pytest

from engine.phases.model import request_tokenizer, request_window, step_endpoints
from sessions.models import ModelEndpoint
from tests.factories import AgentFactory, ModelEndpointFactory, SessionFactory

pytestmark = pytest.mark.django_db


def _endpoint(name: str, **fields: object) -> ModelEndpoint:
    fields.setdefault("api", "openai")
    return ModelEndpointFactory(name=name, base_url="http://127.0.0.1:9/v1", **fields)


def test_a_fallback_with_another_tokenizer_counts_the_larger_of_both() -> None:
    main = _endpoint("main", tokenizer="o200k_base", context_window=8000)
    older = _endpoint("older", tokenizer="cl100k_base", context_window=4000)
    agent = AgentFactory(model=main, fallback_model=older)
    session = SessionFactory(agent=agent)
    assert request_tokenizer(agent, session).key == "max(o200k_base,cl100k_base)"
    assert request_window(agent, session) == 4000
    older.enabled = False  # never called: neither its window nor its tokenizer counts
    assert request_tokenizer(agent, session).key == "o200k_base"
    assert request_window(agent, session) == 8000


def test_the_rollout_candidate_is_counted_with_its_own_tokenizer() -> None:
    main = _endpoint("main", tokenizer="o200k_base")
    candidate = _endpoint("candidate", api="anthropic")
    agent = AgentFactory(model=main, candidate_model=candidate, candidate_percent=100)
    session = SessionFactory(agent=agent)
    assert step_endpoints(agent, session) == [candidate]
    assert request_tokenizer(agent, session).key == "max(o200k_base,estimate:3.5)"
    agent.candidate_percent = 0
    assert request_tokenizer(agent, session).key == "o200k_base"


def test_a_routed_small_model_may_escalate_so_the_agents_model_counts_too() -> None:
    main = _endpoint("main", tokenizer="cl100k_base", context_window=16000)
    small = _endpoint("small", context_window=6000)
    agent = AgentFactory(model=main)
    session = SessionFactory(agent=agent)
    assert step_endpoints(agent, session, small) == [small, main]
    assert request_window(agent, session, small) == 6000
    assert request_tokenizer(agent, session, small).key == "max(o200k_base,cl100k_base)"
