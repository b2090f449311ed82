"""Fixtures for the engine tests: the fake model servers (real HTTP on 127.0.0.1)."""

from tests.fakes.fixtures import fake_servers, openai_server  # noqa: F401
