"""The record's tests share the session fixtures (owners, rules-model agents, sessions)."""

from tests.sessions.conftest import make_agent, make_session, owner, rules_model  # noqa: F401
