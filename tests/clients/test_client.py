"""Where the client sends its requests: the REST and websocket roots from a base URL."""

import pytest
from agentplatform_client import Client
from agentplatform_client.client import _settings


@pytest.mark.parametrize(
    ("base", "rest", "ws"),
    [
        ("http://127.0.0.1:8000", "http://127.0.0.1:8000/api/v1/", "ws://127.0.0.1:8000"),
        ("http://127.0.0.1:8000/", "http://127.0.0.1:8000/api/v1/", "ws://127.0.0.1:8000"),
        ("http://h:1/api/v1/", "http://h:1/api/v1/", "ws://h:1"),
        ("https://agents.example.com/x", "https://agents.example.com/x/api/v1/", "wss://agents.example.com/x"),
    ],
)  # fmt: skip
def test_the_roots_follow_the_base_url(base, rest, ws):
    assert _settings(base, "k") == (rest, ws, "k")


def test_the_environment_supplies_what_is_not_passed(monkeypatch):
    monkeypatch.setenv("AGENTPLATFORM_URL", "http://10.0.0.2:9000")
    monkeypatch.setenv("AGENTPLATFORM_API_KEY", "ap_env")
    assert _settings(None, None) == ("http://10.0.0.2:9000/api/v1/", "ws://10.0.0.2:9000", "ap_env")


def test_no_key_anywhere_is_refused_at_construction(monkeypatch):
    monkeypatch.delenv("AGENTPLATFORM_API_KEY", raising=False)
    with pytest.raises(ValueError, match="API key"):
        Client("http://127.0.0.1:8000")
    with pytest.raises(ValueError, match="http"):
        _settings("ftp://x", "k")


def test_a_fork_sends_the_role_only_when_one_is_named():
    from agentplatform_client.client import _Calls

    assert _Calls.fork("s-1", 3).body == {"checkpoint": 3}
    assert _Calls.fork("s-1", 3, "support").body == {"checkpoint": 3, "role": "support"}
