"""Fixtures of the evaluations' tests: an agent on the strict fake OpenAI-compatible server
with HTTP tools on a scripted business API (tests/tools/http_server.py), and a recorded
conversation on it, run in-process on the real engine (PostgreSQL, Redis)."""

import itertools
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from engine.runner import loop as runner
from record.models import Agent, ModelEndpoint, Session
from sessions.services import message_post
from tests.factories import (
    AgentFactory,
    ModelEndpointFactory,
    SessionFactory,
    ToolFactory,
    UserFactory,
)
from tests.fakes.fixtures import fake_servers, openai_server, unique  # noqa: F401
from tests.fakes.model_servers import Call, FakeModelServer, Reply
from tests.tools.http_server import Answer, ScriptedApi

MODEL_KEY_ENV = "EVALUATIONS_TEST_MODEL_KEY"
_counter = itertools.count()


@pytest.fixture
def business_api() -> Iterator[ScriptedApi]:
    with ScriptedApi(Answer(200, {"number": "SO-1001", "customer_id": 7, "total": 42.0})) as api:
        yield api


@pytest.fixture
def endpoint_on(
    openai_server: FakeModelServer,  # noqa: F811
    unique: str,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    db: None,
) -> Callable[[str], ModelEndpoint]:
    """A model endpoint on the fake server, named `<name>-<unique>` (breakers are per name)."""
    monkeypatch.setenv(MODEL_KEY_ENV, "sk-evaluations-test-0123456789")

    def make(name: str) -> ModelEndpoint:
        return ModelEndpointFactory(
            name=f"{name}-{unique}",
            api="openai",
            base_url=openai_server.base_url,
            model=f"{name}-model",
            api_key_env=MODEL_KEY_ENV,
            first_token_timeout_s=5.0,
            total_timeout_s=10.0,
            price_input_per_1k="0.150000",
            price_output_per_1k="0.600000",
        )

    return make


def _http_tool(name: str, url: str, method: str, properties: dict[str, Any], **fields: Any) -> None:
    ToolFactory(
        name=name,
        kind="http",
        handler="",
        url=url,
        method=method,
        roles=["support"],
        timeout_s=5,
        parameters={
            "type": "object",
            "properties": properties,
            "required": list(properties),
            "additionalProperties": False,
        },
        **fields,
    )


@pytest.fixture
def shop_agent(
    endpoint_on: Callable[[str], ModelEndpoint],
    business_api: ScriptedApi,
    unique: str,  # noqa: F811
) -> Agent:
    """The demo's shape: look an order up (read-only), issue a coupon or cancel (side effects)."""
    _http_tool("get_order", business_api.url("/orders"), "GET", {"number": {"type": "string"}})
    _http_tool(
        "issue_coupon",
        business_api.url("/coupons"),
        "POST",
        {"customer_id": {"type": "integer"}, "amount": {"type": "number"}},
        side_effects=True,
    )
    _http_tool(
        "cancel_order",
        business_api.url("/cancel"),
        "POST",
        {"number": {"type": "string"}},
        side_effects=True,
    )
    agent: Agent = AgentFactory(
        slug=f"shop-{unique}-{next(_counter)}",
        model=endpoint_on("main"),
        system_prompt="You are the shop's support agent.",
        tools=["get_order", "issue_coupon", "cancel_order"],
    )
    return agent


def recorded_script() -> tuple[Reply, ...]:
    """The recorded turn: look the order up, issue a coupon, answer."""
    return (
        Reply(calls=[Call("get_order", {"number": "SO-1001"})]),
        Reply(calls=[Call("issue_coupon", {"customer_id": 7, "amount": 10})]),
        Reply(text="I issued a coupon of 10 for order SO-1001."),
    )


def run_turn(session: Session, content: str) -> Session:
    message_post(session=session, content=content)
    result = runner.session_run(session_id=session.pk)
    assert result.stopped == "idle", result
    return Session.objects.get(pk=session.pk)


@pytest.fixture
def recorded(
    shop_agent: Agent,
    openai_server: FakeModelServer,  # noqa: F811
    business_api: ScriptedApi,
) -> Session:
    """A conversation of two turns on the real engine: a greeting, then the refund."""
    session: Session = SessionFactory(
        agent=shop_agent, owner=UserFactory(username=f"shopper-{next(_counter)}")
    )
    openai_server.script(Reply(text="Hello! How can I help?"))
    run_turn(session, "hi")
    openai_server.script(*recorded_script())
    session = run_turn(session, "my order SO-1001 came late, please compensate me")
    assert [r.path for r in business_api.requests] == ["/orders", "/coupons"]
    return session
