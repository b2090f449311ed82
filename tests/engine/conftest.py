"""The engine's tests: the fake model servers (tests/fakes) for those that talk to one over
HTTP, and the sessions' fixtures (an agent on the offline rules model, a session)."""

from tests.fakes.fixtures import fake_servers, openai_server, unique  # noqa: F401
from tests.sessions.conftest import make_agent, make_session, owner, rules_model  # noqa: F401
