"""Fixtures for metering through the engine: an agent on the fake OpenAI-compatible
server, a paid python tool whose effects land in a table, and a credit account."""

import itertools
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connection

from record.models import Agent, ModelEndpoint
from tests.factories import AgentFactory, ModelEndpointFactory, ToolFactory
from tests.fakes.fixtures import fake_servers, openai_server, unique  # noqa: F401
from tests.fakes.model_servers import Call, FakeModelServer, Recorded, Reply
from tools.registry import tool_handler

MODEL_KEY_ENV = "BILLING_TEST_MODEL_KEY"
EFFECTS = "billing_test_effects"


@tool_handler("tests.billing.charge", wants_idempotency_key=True)
def _charge(n: int, idempotency_key: str) -> dict[str, Any]:
    """A side effect that is idempotent by key, as a well-behaved paid API is."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {EFFECTS} (key) VALUES (%s) ON CONFLICT DO NOTHING", [idempotency_key]
        )
    return {"charged": n}


@pytest.fixture
def effects(transactional_db: None) -> Iterator[Callable[[], int]]:
    """The tool's effects table; yields a counter of the effects that happened."""
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE TABLE IF NOT EXISTS {EFFECTS} (key text PRIMARY KEY)")
        cursor.execute(f"TRUNCATE {EFFECTS}")

    def count() -> int:
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT count(*) FROM {EFFECTS}")
            return int(cursor.fetchone()[0])

    yield count
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE IF EXISTS {EFFECTS}")


@pytest.fixture
def fake_endpoint(
    openai_server: FakeModelServer,  # noqa: F811 - the fixture imported above
    unique: str,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    transactional_db: None,
) -> ModelEndpoint:
    monkeypatch.setenv(MODEL_KEY_ENV, "sk-billing-test-0123456789")
    endpoint: ModelEndpoint = ModelEndpointFactory(
        name=f"fake-billing-{unique}",
        api="openai",
        base_url=openai_server.base_url,
        model="fake-model-1",
        api_key_env=MODEL_KEY_ENV,
        first_token_timeout_s=5.0,
        total_timeout_s=10.0,
    )
    return endpoint


@pytest.fixture
def paid_agent(fake_endpoint: ModelEndpoint, unique: str) -> Callable[..., Agent]:  # noqa: F811
    counter = itertools.count()

    def make(points: int = 10, **fields: Any) -> Agent:
        ToolFactory(
            name="charge",
            kind="python",
            handler="tests.billing.charge",
            side_effects=True,
            credit_cost=points,
            roles=[],
            parameters={
                "type": "object",
                "properties": {"n": {"type": "integer"}},
                "required": ["n"],
                "additionalProperties": False,
            },
        )
        fields.setdefault("slug", f"billing-{unique}-{next(counter)}")
        return AgentFactory(
            model=fake_endpoint,
            system_prompt="Use the tools.",
            tools=["charge"],
            **fields,
        )

    return make


def call_then_answer(recorded: Recorded) -> Reply:
    """The model calls the paid tool once, then answers with what it got."""
    if recorded.tool_results():
        return Reply(text=f"done: {recorded.last_tool_result()}")
    return Reply(calls=[Call("charge", {"n": 1})])


def always_call(recorded: Recorded) -> Reply:
    """A model that insists on the paid tool whatever it is told."""
    return Reply(calls=[Call("charge", {"n": len(recorded.tool_results()) + 1})])
