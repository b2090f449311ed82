"""Where the client sends its requests: the REST and websocket roots from a base URL."""

import json

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


RUN_ID = "0b7e5c3a-1d2f-4e5a-9b8c-7d6e5f4a3b2c"


def _run_server(states: list[dict]):
    """A fake server: POST .../runs/ starts the run; each GET of it is the next state."""
    import httpx

    seen: list[tuple[str, str, bytes]] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append((request.method, request.url.path, request.content))
        if request.method == "POST":
            return httpx.Response(
                201,
                json={
                    "id": RUN_ID,
                    "workflow": "refund",
                    "version": 3,
                    "state": "processing",
                    "role": "support",
                    "metadata": {"ticket": "T-1"},
                    "created_at": "2026-12-07T10:00:00Z",
                },
            )
        state = states.pop(0) if len(states) > 1 else states[0]
        workflow = {"slug": "refund", "version": 3, "active": [], "result": None, "error": None}
        return httpx.Response(
            200, json=_session_row(state=state["state"], workflow={**workflow, **state["run"]})
        )

    return httpx.MockTransport(handle), seen


def test_a_workflow_run_is_started_and_waited_for_until_its_result():
    import httpx
    from agentplatform_client import Client, WorkflowRun

    transport, seen = _run_server(
        [
            {"state": "processing", "run": {"active": ["lookup"]}},
            {"state": "finished", "run": {"result": {"refunded": 20}}},
        ]
    )
    client = Client("http://h:1", api_key="k", http=httpx.Client(transport=transport))
    run = client.start_workflow(
        "refund", {"order": "SO-1001"}, idempotency_key="k-1", metadata={"ticket": "T-1"}
    )
    assert (run.id, run.state, run.workflow) == (
        RUN_ID,
        "processing",
        WorkflowRun(slug="refund", version=3, active=[]),
    )
    assert seen[0][:2] == ("POST", "/api/v1/workflows/refund/runs/")
    assert json.loads(seen[0][2]) == {
        "input": {"order": "SO-1001"},
        "idempotency_key": "k-1",
        "metadata": {"ticket": "T-1"},
    }
    ended = client.wait_for_run(run, timeout=5, poll=0.01)
    assert ended.result == {"refunded": 20} and ended.error is None
    assert [s[:2] for s in seen[1:]] == [("GET", f"/api/v1/sessions/{RUN_ID}/")] * 2


def test_waiting_for_a_run_that_failed_gives_its_error_and_one_that_never_ends_times_out():
    import asyncio

    import httpx
    from agentplatform_client import AsyncClient

    error = {"node": "refund", "message": "card declined"}
    transport, _ = _run_server([{"state": "error", "run": {"error": error}}])

    async def failed():
        client = AsyncClient("http://h:1", api_key="k", http=httpx.AsyncClient(transport=transport))
        return await client.wait_for_run(RUN_ID, timeout=5, poll=0.01)

    assert asyncio.run(failed()).error == error

    transport, _ = _run_server([{"state": "awaiting_approval", "run": {"active": ["review"]}}])
    client = Client("http://h:1", api_key="k", http=httpx.Client(transport=transport))
    with pytest.raises(TimeoutError, match=RUN_ID):
        client.wait_for_run(RUN_ID, timeout=0.05, poll=0.01)


def test_a_webhook_is_sent_as_an_object_where_turns_and_runs_start_and_only_when_named():
    from agentplatform_client.client import _Calls

    hook = {"webhook": {"url": "https://app.example/runs"}}
    assert _Calls.create_session("a", None, None, None, "https://app.example/runs").body == {
        "agent": "a",
        **hook,
    }
    assert _Calls.send_message("s-1", "hi", None, "https://app.example/runs").body == {
        "content": "hi",
        **hook,
    }
    assert _Calls.start_workflow("f", {}, None, None, "https://app.example/runs").body == {
        "input": {},
        **hook,
    }
    assert "webhook" not in (_Calls.send_message("s-1", "hi", None).body or {})
