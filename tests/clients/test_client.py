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


def _session_row(**extra):
    return {"id": "0b7e5c3a-1d2f-4e5a-9b8c-7d6e5f4a3b2c", "agent": "order-support", **extra}


def test_a_session_object_is_accepted_wherever_an_id_is():
    from agentplatform_client import Session
    from agentplatform_client.client import _Calls
    from agentplatform_client.stream import EventStream, ReconnectPolicy

    session = Session.from_dict(_session_row())
    sid = session.id
    assert _Calls.get_session(session).path == f"sessions/{sid}/"
    assert _Calls.send_message(session, "hi", None).path == f"sessions/{sid}/messages/"
    assert _Calls.list_events(session, 0, None).path == f"sessions/{sid}/events/"
    assert _Calls.cancel(session).path == f"sessions/{sid}/cancel/"
    assert _Calls.fork(session, 3).path == f"sessions/{sid}/fork/"
    assert _Calls.resume(session).path == f"sessions/{sid}/resume/"
    assert _Calls.checkpoints(session, None).path == f"sessions/{sid}/checkpoints/"
    assert _Calls.get_session(sid).path == f"sessions/{sid}/"  # an id as before
    stream = EventStream(
        ws_base="ws://h:1",
        session_id=session,
        api_key="k",
        after=0,
        policy=ReconnectPolicy(),
        fetch_after=lambda after: [],
    )
    assert stream.session_id == sid


def test_a_workflow_runs_session_types_its_workflow_and_a_conversation_has_none():
    from agentplatform_client import Session, WorkflowRun

    run = Session.from_dict(
        _session_row(
            workflow={
                "slug": "refund",
                "version": 2,
                "active": [],
                "result": {"refunded": True},
                "error": None,
            }
        )
    )
    assert run.workflow == WorkflowRun(
        slug="refund", version=2, active=[], result={"refunded": True}, error=None
    )
    assert Session.from_dict(_session_row(workflow=None)).workflow is None
    assert Session.from_dict(_session_row()).workflow is None
