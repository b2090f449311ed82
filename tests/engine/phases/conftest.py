"""The tool step's tests run a scripted model on the fake OpenAI-compatible server and the
demo business API: the tools' fixtures (their agent and session replace the sessions')."""

from tests.tools.conftest import demo_api, fake_endpoint, make_agent, make_session  # noqa: F401
