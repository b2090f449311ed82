"""The fake model servers (tests/fakes) for the engine tests that talk to one over HTTP."""

from tests.fakes.fixtures import fake_servers, openai_server, unique  # noqa: F401
