"""Fixtures for the model adapter tests: the fake model servers and endpoints aimed at them."""

import contextlib
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from llm.base import EndpointConfig
from tests.fakes.fixtures import anthropic_server, fake_servers, openai_server, unique  # noqa: F401
from tests.fakes.model_servers import FakeModelServer
from tests.stack import free_port

KEY_ENV = "FAKE_MODEL_TEST_KEY"
KEY = "sk-test-0123456789abcdef"


@pytest.fixture
def api_key(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(KEY_ENV, KEY)
    return KEY


@pytest.fixture
def endpoint_for(api_key: str) -> Callable[..., EndpointConfig]:
    """An EndpointConfig aimed at a fake server (short timeouts, key from the env var)."""

    def make(server: FakeModelServer, api: str | None = None, **fields: Any) -> EndpointConfig:
        fields.setdefault("name", f"fake-{server.api}")
        fields.setdefault("model", "fake-model-1")
        fields.setdefault("api_key_env", KEY_ENV)
        fields.setdefault("connect_timeout_s", 2.0)
        fields.setdefault("first_token_timeout_s", 3.0)
        fields.setdefault("total_timeout_s", 10.0)
        return EndpointConfig(api=api or server.api, base_url=server.base_url, **fields)

    return make


@pytest.fixture
def dead_url() -> str:
    """A URL on which nothing listens (connection refused)."""
    return f"http://127.0.0.1:{free_port()}/v1"


@pytest.fixture
def unreachable_url() -> Iterator[str]:
    """A URL whose TCP connect never completes: a listening socket with its backlog full."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    port = server.getsockname()[1]
    fillers = []
    for _ in range(8):
        filler = socket.socket()
        filler.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            filler.connect(("127.0.0.1", port))
        fillers.append(filler)
    time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        for filler in fillers:
            filler.close()
        server.close()
