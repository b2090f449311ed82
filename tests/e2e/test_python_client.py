"""The Python client (clients/python, `agentplatform_client`) against the live platform:
a full turn with tool calls, typed events and responses, errors as exceptions, approvals,
and a websocket that drops (or whose server restarts) in the middle of a turn."""

import asyncio
import os
import re
import subprocess
import sys
import time
import uuid

import httpx
import pytest
from agentplatform_client import (
    ApprovalRequested,
    ApprovalResolved,
    AsyncClient,
    AuthenticationError,
    Client,
    ConflictError,
    Event,
    MessageCompleted,
    MessageDelta,
    NotFoundError,
    PermissionDeniedError,
    ReconnectPolicy,
    Session,
    StateChanged,
    ToolFinished,
    ToolStarted,
    TurnFinished,
    ValidationError,
)

from accounts.services import api_key_create, approver_grant
from tests.demo_setup import DEMO_REQUEST, demo_install
from tests.e2e.support import set_model_options, stack_logs
from tests.factories import AgentFactory, ModelEndpointFactory, ToolFactory, api_key_for
from tests.stack import ROOT, Stack, free_port

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

DEMO_TOOLS = [
    "query_orders",
    "send_notification",
    "send_notification",
    "send_notification",
    "generate_report",
]


def _persisted(events: list[Event]) -> list[Event]:
    return [e for e in events if e.seq is not None]


def _assert_whole_history(client: Client, session_id: str, seen: list[Event]) -> None:
    """The stream's persisted events are the session's history: each seq once, in order,
    from 1, equal to what REST lists."""
    stream = _persisted(seen)
    history = list(client.iter_events(session_id))
    assert [e.seq for e in stream] == list(range(1, len(history) + 1)), [e.seq for e in stream]
    assert [(e.seq, e.type, e.data) for e in stream] == [(e.seq, e.type, e.data) for e in history]


def test_a_full_demo_turn_with_tool_calls_through_the_sync_client(live_stack: Stack):
    demo_install()
    key = api_key_for("alice")
    with Client(live_stack.http, key) as client:
        assert "order-support" in [a.slug for a in client.agents()]
        assert {"query_orders", "send_notification"} <= {t.name for t in client.tools()}
        session = client.create_session("order-support", metadata={"ticket": "T-1"})
        assert (session.state, session.agent, session.metadata) == (
            "idle",
            "order-support",
            {"ticket": "T-1"},
        )

        result = client.run_turn(session.id, DEMO_REQUEST, idempotency_key="req-1", timeout=60)

        events = result.events
        # Typed events: every type arrives as its class, with its fields filled.
        assert isinstance(events[0], StateChanged)
        assert (events[0].from_state, events[0].to_state) == ("idle", "processing")
        started = [e for e in events if isinstance(e, ToolStarted)]
        finished = [e for e in events if isinstance(e, ToolFinished)]
        assert [e.tool for e in started] == [e.tool for e in finished] == DEMO_TOOLS
        assert all(e.status == "success" and e.elapsed_ms is not None for e in finished), finished
        assert [e.call_id for e in started] == [e.call_id for e in finished]
        assert isinstance(events[-1], TurnFinished) and result.finished is events[-1]
        assert result.finished.stop_reason == "answer" and result.finished.iterations == 4
        assert result.answer.startswith("Done. I found 3 orders"), result.answer
        assert result.tool_calls == DEMO_TOOLS
        deltas = [e for e in events if isinstance(e, MessageDelta)]
        assert deltas and "".join(d.text for d in deltas) == result.answer
        _assert_whole_history(client, session.id, events)

        # Typed responses of the rest of the API.
        messages = client.list_messages(session.id, limit=100)
        completed = [e for e in events if isinstance(e, MessageCompleted)]
        assert [(m.seq, m.role, m.content) for m in messages] == [
            (e.message_seq, e.role, e.content) for e in completed
        ]
        assert messages[0].idempotency_key == "req-1"
        again = client.send_message(session.id, DEMO_REQUEST, idempotency_key="req-1")
        assert not again.created and again.message.id == messages[0].id
        current = client.get_session(session.id)
        assert current.state == "finished" and current.turn == 1
        assert current.usage.input_tokens == result.finished.usage.input_tokens > 0
        assert session.id in [s.id for s in client.list_sessions()]
        usage = client.usage()
        assert usage.tokens.input >= result.finished.usage.input_tokens
        checkpoints = client.checkpoints(session.id)
        assert checkpoints and checkpoints[0].step >= checkpoints[-1].step
        fork = client.fork(session.id, checkpoint=checkpoints[-1].step)
        assert fork.id != session.id and fork.agent == "order-support"
        with pytest.raises(ConflictError) as resumed:
            client.resume(session.id)  # only a run in `error` resumes
        assert resumed.value.status == 409


def test_the_async_client_streams_a_turn_it_starts_over_the_websocket(live_stack: Stack):
    demo_install()
    key = api_key_for("alice")

    async def scenario() -> tuple[str, list[Event]]:
        async with AsyncClient(live_stack.http, key) as client:
            session = await client.create_session("order-support")
            seen: list[Event] = []
            async with client.stream(session.id) as stream:
                await stream.send_message(DEMO_REQUEST, idempotency_key="ws-1")
                async with asyncio.timeout(60):
                    async for event in stream:
                        seen.append(event)
                        if isinstance(event, TurnFinished):
                            break
                assert stream.reconnects == 0
            assert (await client.get_session(session.id)).state == "finished"
            return session.id, seen

    session_id, seen = asyncio.run(scenario())
    with Client(live_stack.http, key) as client:
        _assert_whole_history(client, session_id, seen)
    assert [e.tool for e in seen if isinstance(e, ToolFinished)] == DEMO_TOOLS


def test_errors_come_as_exceptions_with_the_error_shape(live_stack: Stack):
    demo_install()
    key = api_key_for("alice")
    missing = str(uuid.uuid4())
    with Client(live_stack.http, key) as client:
        with pytest.raises(NotFoundError) as not_found:
            client.get_session(missing)
        assert (not_found.value.status, not_found.value.code) == (404, "not_found")
        with pytest.raises(ValidationError) as invalid:
            client.create_session("no such agent!")
        assert invalid.value.status == 400 and invalid.value.code == "invalid_input"
        assert invalid.value.details, invalid.value
        session = client.create_session("order-support")
        with pytest.raises(ValidationError) as bad_fork:
            client.fork(session.id, checkpoint=0)
        assert bad_fork.value.code == "invalid_input" and bad_fork.value.message
        with pytest.raises(PermissionDeniedError) as denied:
            client.approvals()
        assert denied.value.status == 403
        # The websocket refuses an unknown session: the stream raises, it does not retry.
        with pytest.raises(NotFoundError) as ws_missing, client.stream(missing) as stream:
            stream.receive(timeout=10)
        assert ws_missing.value.code == "not_found"
    with Client(live_stack.http, "ap_wrong") as stranger:
        with pytest.raises(AuthenticationError) as unauthenticated:
            stranger.get_session(session.id)
        assert unauthenticated.value.status == 401 and unauthenticated.value.code
        with pytest.raises(AuthenticationError) as ws_denied, stranger.stream(session.id) as stream:
            stream.receive(timeout=10)
        assert ws_denied.value.code == "not_authenticated"


def _approval_agent() -> str:
    """A rules agent whose `stamp` tool (a built-in every process has) needs approval."""
    ToolFactory(
        name="stamp",
        handler="builtin.current_time",
        side_effects=True,
        requires_approval=True,
        parameters={"type": "object", "properties": {}},
    )
    slug = f"approving-{uuid.uuid4().hex[:8]}"
    AgentFactory(
        slug=slug,
        model=ModelEndpointFactory(name="rules", api="rules", options={}),
        tools=["stamp"],
        rules=[
            {"when": {"last_tool": "stamp", "result": '"status":"rejected"'}, "answer": "Refused: {{ result.error }}"},
            {"when": {"last_tool": "stamp"}, "answer": "Stamped at {{ tools.stamp.now }}"},
            {"when": {"user": "stamp (\\w+)", "last_tool": None},
             "tool_calls": [{"tool": "stamp", "args": {}}]},
            {"answer": "?"},
        ],
    )  # fmt: skip
    return slug


def test_approvals_through_the_client_approve_one_call_and_reject_another(live_stack: Stack):
    slug = _approval_agent()
    customer_key = api_key_for("carol")
    approver_key = api_key_create(username="alice", roles=[]).raw
    approver_grant(username="alice")

    def decide(client: Client, approver: Client, text: str, approve: bool) -> list[Event]:
        session = client.create_session(slug)
        seen: list[Event] = []
        with client.stream(session.id) as stream:
            client.send_message(session.id, text)
            while True:
                event = stream.receive(timeout=30)
                seen.append(event)
                if isinstance(event, ApprovalRequested):
                    [pending] = [a for a in approver.approvals() if a.session == session.id]
                    assert pending.id == event.approval_id and pending.tool == "stamp"
                    assert pending.status == "pending" and pending.deadline is not None
                    if approve:
                        decided = approver.approve(pending.id, comment="fine")
                        assert decided.status == "approved"
                    else:
                        decided = approver.reject(pending.id, comment="not today")
                        assert decided.status == "rejected"
                    with pytest.raises(ConflictError) as twice:
                        approver.approve(pending.id)
                    assert twice.value.code == "approval_resolved"
                if isinstance(event, TurnFinished):
                    return seen

    with (
        Client(live_stack.http, customer_key) as client,
        Client(live_stack.http, approver_key) as approver,
    ):
        approved = decide(client, approver, "stamp A", approve=True)
        rejected = decide(client, approver, "stamp B", approve=False)

    [resolved] = [e for e in approved if isinstance(e, ApprovalResolved)]
    assert (resolved.outcome, resolved.by, resolved.comment) == ("approved", "alice", "fine")
    [ran] = [e for e in approved if isinstance(e, ToolFinished)]
    assert ran.status == "success"
    assert approved[-1].stop_reason == "answer"  # type: ignore[attr-defined]
    [refused] = [e for e in rejected if isinstance(e, ApprovalResolved)]
    assert (refused.outcome, refused.comment) == ("rejected", "not today")
    answers = [
        e.content for e in rejected if isinstance(e, MessageCompleted) and e.role == "assistant"
    ]
    assert answers[-1].startswith("Refused"), answers


def test_run_turn_returns_the_answer_to_its_own_message_while_another_turn_runs(
    live_stack: Stack,
):
    """A message sent while a turn runs is queued behind it: run_turn waits through the
    running turn (whose answer it does not return) to the turn that answers its message,
    with the sync and the async client alike."""
    AgentFactory(
        slug="slow-echo",
        model=ModelEndpointFactory(name="slow-rules", api="rules", options={}),
        rules=[{"answer": "Echo: {{ user }}"}],
    )
    set_model_options("slow-rules", latency_s=1.5)
    key = api_key_for("alice")
    with Client(live_stack.http, key) as client:
        session = client.create_session("slow-echo")
        client.send_message(session.id, "first")
        result = client.run_turn(session.id, "second", timeout=60)
        answers = [
            e.content
            for e in result.events
            if isinstance(e, MessageCompleted) and e.role == "assistant"
        ]
        assert answers == ["Echo: first", "Echo: second"], answers
        assert (result.finished.turn, result.answer) == (2, "Echo: second")

    async def scenario() -> tuple[list[str], int, str]:
        async with AsyncClient(live_stack.http, key) as client:
            session = await client.create_session("slow-echo")
            await client.send_message(session.id, "third")
            result = await client.run_turn(session.id, "fourth", timeout=60)
            said = [
                e.content
                for e in result.events
                if isinstance(e, MessageCompleted) and e.role == "assistant"
            ]
            return said, result.finished.turn, result.answer

    assert asyncio.run(scenario()) == (["Echo: third", "Echo: fourth"], 2, "Echo: fourth")


def test_the_session_and_message_lists_are_walked_page_by_page(live_stack: Stack):
    AgentFactory(slug="pager", rules=[{"answer": "Echo: {{ user }}"}])
    key = api_key_for("pat")
    with Client(live_stack.http, key) as client:
        sessions = [client.create_session("pager") for _ in range(3)]
        for n in range(3):
            client.run_turn(sessions[0].id, f"m{n}", timeout=30)
        assert [s.id for s in client.iter_sessions(page=2)] == [s.id for s in reversed(sessions)]
        said = [m.content for m in client.iter_messages(sessions[0].id, page=4)]
        assert said == ["Echo: m2", "m2", "Echo: m1", "m1", "Echo: m0", "m0"]

    async def walk() -> tuple[list[str], list[str]]:
        async with AsyncClient(live_stack.http, key) as client:
            ids = [s.id async for s in client.iter_sessions(page=2)]
            texts = [m.content async for m in client.iter_messages(sessions[0].id, page=5)]
            return ids, texts

    ids, texts = asyncio.run(walk())
    assert ids == [s.id for s in reversed(sessions)] and texts == said


def test_a_socket_cut_mid_turn_resumes_with_no_gap_and_no_duplicate(live_stack: Stack):
    """The client's socket is cut three times while a slow turn runs; the stream
    reconnects from its last seq each time and hands out the whole history once."""
    demo_install()
    set_model_options("rules", latency_s=0.3, chunk_delay_s=0.02)
    key = api_key_for("alice")

    async def scenario() -> tuple[str, list[Event], int]:
        async with AsyncClient(live_stack.http, key) as client:
            session = await client.create_session("order-support")
            seen: list[Event] = []
            cuts = {4, 9, 14}  # cut after these many persisted events
            async with client.stream(session.id) as stream:
                await client.send_message(session.id, DEMO_REQUEST)
                async with asyncio.timeout(90):
                    async for event in stream:
                        seen.append(event)
                        if isinstance(event, TurnFinished):
                            break
                        if event.seq is not None and len(_persisted(seen)) in cuts:
                            await stream.drop_connection()
                return session.id, seen, stream.reconnects

    session_id, seen, reconnects = asyncio.run(scenario())
    assert reconnects == 3, stack_logs(live_stack)()
    with Client(live_stack.http, key) as client:
        _assert_whole_history(client, session_id, seen)
    assert [e.tool for e in seen if isinstance(e, ToolFinished)] == DEMO_TOOLS


def test_a_daphne_restart_mid_turn_resumes_with_no_gap_and_no_duplicate(live_stack: Stack):
    """The server side goes away: every web process is stopped while a turn runs on the
    worker, then started again; the blocking stream waits, reconnects from its last seq,
    and gets the events committed meanwhile from the replay, each once."""
    demo_install()
    set_model_options("rules", latency_s=0.4, chunk_delay_s=0.02)
    key = api_key_for("alice")
    patient = ReconnectPolicy(initial_delay_s=0.1, max_delay_s=0.5, max_attempts=200)
    restarted = False
    with Client(live_stack.http, key, reconnect=patient) as client:
        session = client.create_session("order-support")
        seen: list[Event] = []
        try:
            with client.stream(session.id) as stream:
                client.send_message(session.id, DEMO_REQUEST)
                while True:
                    event = stream.receive(timeout=90)
                    seen.append(event)
                    if isinstance(event, TurnFinished):
                        break
                    if not restarted and isinstance(event, ToolFinished):
                        live_stack.stop("web")
                        restarted = True
                        live_stack.restart("web")
                reconnects = stream.reconnects
        finally:
            live_stack.wait_ready(60)
        assert reconnects >= 1
        _assert_whole_history(client, session.id, seen)
    assert [e.tool for e in seen if isinstance(e, ToolFinished)] == DEMO_TOOLS


def _wait_for_state(client: Client, session_id: str, state: str, timeout: float = 30) -> Session:
    deadline = time.monotonic() + timeout
    while True:
        session = client.get_session(session_id)
        if session.state == state or time.monotonic() > deadline:
            return session
        time.sleep(0.1)


def _readme_examples() -> list[tuple[str, str]]:
    """The Python programs of the manual's "Python client" page: (the line that runs it, code)."""
    section = (ROOT / "docs" / "python-client.md").read_text()
    return re.findall(r"^([^\n]*)<<'PY'\n(.*?)^PY$", section, flags=re.M | re.S)


def test_the_manual_examples_run_against_the_live_stack(live_stack: Stack):
    demo_install()
    customer = api_key_for("alice")
    approver = api_key_create(username="bob", roles=[]).raw
    approver_grant(username="bob")
    # A call waiting for a person, for the approvals example to approve.
    with Client(live_stack.http, customer) as client:
        waiting = client.create_session(_approval_agent())
        client.send_message(waiting.id, "stamp R1")
        _wait_for_state(client, waiting.id, "awaiting_approval")
    with Client(live_stack.http, approver) as approving:
        [gated] = [a.id for a in approving.approvals() if a.session == waiting.id]
    examples = _readme_examples()
    assert len(examples) == 4, [line for line, _ in examples]
    outputs = []
    for line, code in examples:
        key = approver if "APPROVER_KEY" in line else customer
        env = {
            **os.environ,
            "AGENTPLATFORM_URL": live_stack.http,
            "AGENTPLATFORM_API_KEY": key,
        }
        run = subprocess.run(
            [sys.executable, "-"], input=code, text=True, capture_output=True, env=env, timeout=180
        )
        assert run.returncode == 0, f"{line}\n{code}\n--- stderr\n{run.stderr}"
        assert "Traceback" not in run.stderr, run.stderr
        outputs.append(run.stdout)
    turn, streamed, errors, _approvals = outputs
    assert "Done. I found 3 orders" in turn and "ran send_notification success" in turn, turn
    assert "answer after 0 reconnects" in streamed, streamed
    assert errors.splitlines()[0].startswith("404 not_found"), errors
    assert errors.splitlines()[1].startswith("invalid_input {'agent': "), errors
    assert errors.splitlines()[2] == "409 not_resumable", errors
    # The approvals example approved the pending call; its turn ran the tool and finished.
    assert f"{gated} stamp {{}}" in _approvals, _approvals
    with Client(live_stack.http, customer) as client:
        finished = _wait_for_state(client, waiting.id, "finished")
        assert finished.state == "finished"
        assert [e.tool for e in client.iter_events(waiting.id) if isinstance(e, ToolFinished)] == [
            "stamp"
        ]


def test_a_workflow_run_is_started_and_its_result_waited_for_through_the_client(
    live_stack: Stack, monkeypatch: pytest.MonkeyPatch
):
    # The demo's business API (get_order, issue_coupon), on a port of its own.
    port = free_port()
    monkeypatch.setenv("DEMO_API_URL", f"http://127.0.0.1:{port}")
    api = live_stack.start(
        "demoapi",
        [sys.executable, "manage.py", "demo_business_api", "--port", str(port)],
    )
    deadline = time.monotonic() + 30
    while True:
        assert api.poll() is None, live_stack.log_tail("demoapi")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "demo_business_api did not start"
        time.sleep(0.1)
    demo_install()
    with Client(live_stack.http, api_key_for("alice")) as client:
        run = client.start_workflow("refund", {"order_number": "SO-1001"}, metadata={"t": "1"})
        assert run.workflow is not None and run.workflow.slug == "refund"

        ended = client.wait_for_run(run, timeout=90)

        assert ended.error is None and ended.result is not None, ended
        # The Session itself where an id is asked for: the run's whole state, typed.
        session = client.get_session(run)
        assert (session.id, session.state, session.metadata) == (run.id, "finished", {"t": "1"})
        assert session.workflow == ended and session.workflow.active == []
