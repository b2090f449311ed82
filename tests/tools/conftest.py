"""Fixtures for the tool-layer tests: agents on the fake OpenAI-compatible server, sessions, the demo API."""

import itertools
import threading
from collections.abc import Callable, Iterator
from http.server import ThreadingHTTPServer
from typing import Any

import pytest

from record.models import Agent, ModelEndpoint, Session
from tests.factories import AgentFactory, ModelEndpointFactory, SessionFactory, UserFactory
from tests.fakes.fixtures import fake_servers, openai_server, unique  # noqa: F401
from tests.fakes.mcp_fixtures import mcp_files, mcp_server  # noqa: F401
from tests.fakes.model_servers import FakeModelServer

MODEL_KEY_ENV = "TOOLS_TEST_MODEL_KEY"


@pytest.fixture
def fake_endpoint(
    openai_server: FakeModelServer,  # noqa: F811 - the fixture imported above
    unique: str,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    db: None,
) -> ModelEndpoint:
    """A model endpoint on the fake OpenAI-compatible server (a name of its own: breakers are per name)."""
    monkeypatch.setenv(MODEL_KEY_ENV, "sk-tools-test-0123456789")
    endpoint: ModelEndpoint = ModelEndpointFactory(
        name=f"fake-openai-{unique}",
        api="openai",
        base_url=openai_server.base_url,
        model="fake-model-1",
        api_key_env=MODEL_KEY_ENV,
        first_token_timeout_s=5.0,
        total_timeout_s=10.0,
    )
    return endpoint


@pytest.fixture
def make_agent(fake_endpoint: ModelEndpoint, unique: str) -> Callable[..., Agent]:  # noqa: F811
    counter = itertools.count()

    def make(**fields: Any) -> Agent:
        fields.setdefault("model", fake_endpoint)
        fields.setdefault("slug", f"tools-{unique}-{next(counter)}")
        fields.setdefault("system_prompt", "You are a test agent. Use the tools.")
        return AgentFactory(**fields)

    return make


@pytest.fixture
def make_session(db) -> Callable[..., Session]:  # type: ignore[no-untyped-def]
    def make(agent: Agent, role: str = "support") -> Session:
        return SessionFactory(agent=agent, owner=UserFactory(username="tools-owner"), role=role)

    return make


@pytest.fixture
def demo_api(db) -> Iterator[str]:  # type: ignore[no-untyped-def]
    """The demo business API (coupons, orders) on a free port, in this process, on the test database."""
    from demo.business_api import Handler

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
