from tests.fakes.mcp_fixtures import mcp_server  # noqa: F401
