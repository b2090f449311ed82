"""Pytest fixtures for the fake model servers.

Import them where needed (a local conftest or a test module):

    from tests.fakes.fixtures import anthropic_server, fake_servers, openai_server  # noqa: F401

The servers start once per test run; every test gets them with an empty script
and no recorded requests, strict (model_servers.strict_problem), and held connections
are released when it ends. A strict violation fails the test at teardown.
"""

import uuid
from collections.abc import Iterator

import pytest

from .model_servers import FakeModelServer, FakeServers


@pytest.fixture(scope="session")
def fake_servers() -> Iterator[FakeServers]:
    servers = FakeServers(
        openai=FakeModelServer("openai").start(), anthropic=FakeModelServer("anthropic").start()
    )
    try:
        yield servers
    finally:
        for server in servers:
            server.stop()


@pytest.fixture
def openai_server(fake_servers: FakeServers) -> Iterator[FakeModelServer]:
    fake_servers.openai.reset()
    yield fake_servers.openai
    errors = list(fake_servers.openai.errors)
    violations = list(fake_servers.openai.violations)
    fake_servers.openai.reset()
    assert not errors, f"the fake server's script failed: {errors}"
    assert not violations, (
        f"the strict fake model was asked for what no real model does: {violations}"
    )


@pytest.fixture
def anthropic_server(fake_servers: FakeServers) -> Iterator[FakeModelServer]:
    fake_servers.anthropic.reset()
    yield fake_servers.anthropic
    errors = list(fake_servers.anthropic.errors)
    violations = list(fake_servers.anthropic.violations)
    fake_servers.anthropic.reset()
    assert not errors, f"the fake server's script failed: {errors}"
    assert not violations, (
        f"the strict fake model was asked for what no real model does: {violations}"
    )


@pytest.fixture
def unique() -> str:
    """A short unique suffix, so Redis breaker state never leaks between tests."""
    return uuid.uuid4().hex[:10]
