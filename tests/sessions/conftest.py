"""Fixtures shared by the session tests: owners, rules-model agents, sessions in a given state."""

from collections.abc import Callable
from typing import Any

import pytest

from record.models import Agent, ModelEndpoint, Session
from tests.factories import AgentFactory, ModelEndpointFactory, SessionFactory, UserFactory


@pytest.fixture
def rules_model(db) -> ModelEndpoint:  # type: ignore[no-untyped-def]
    return ModelEndpointFactory(name="rules", api="rules", options={})


@pytest.fixture
def make_agent(rules_model: ModelEndpoint) -> Callable[..., Agent]:
    def make(**fields: Any) -> Agent:
        fields.setdefault("model", rules_model)
        return AgentFactory(**fields)

    return make


@pytest.fixture
def owner(db):  # type: ignore[no-untyped-def]
    return UserFactory(username="owner")


@pytest.fixture
def make_session(make_agent: Callable[..., Agent], owner) -> Callable[..., Session]:  # type: ignore[no-untyped-def]
    def make(**fields: Any) -> Session:
        fields.setdefault("owner", owner)
        if "agent" not in fields:
            fields["agent"] = make_agent()
        return SessionFactory(**fields)

    return make
