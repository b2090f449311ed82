"""The routing tests' endpoints and keys (tests/llm/conftest.py)."""

from tests.fakes.fixtures import anthropic_server  # noqa: F401
from tests.llm.conftest import api_key, dead_url, endpoint_for, unreachable_url  # noqa: F401
