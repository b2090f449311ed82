"""Durable execution in-process: probes of uncertain calls, leases, checkpoints, timers, retention.

A crash is simulated by the rows it leaves behind: the tool-call intent is
committed, the call is marked dispatched, and the worker's lease is gone. Then
`session_run` (what a replacement worker runs) must take it from there.

`transaction=True`: tools and probes run on helper threads with their own
database connections, which must see the committed rows.
"""

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from approvals.models import Approval
from engine import StaleSession, session_run
from engine.moves.turn import turn_fail
from engine.phases.model import model_step
from engine.phases.tools import tool_step
from engine.runner.lease import Heartbeat, lease_acquire, lease_take, leases_renew
from record.errors import Conflict
from record.models import (
    Agent,
    Checkpoint,
    Event,
    Message,
    ModelCall,
    ModelEndpoint,
    Session,
    ToolCall,
    Transition,
)
from sessions import tasks
from sessions.services import (
    checkpoints_prune,
    message_post,
    review_answer,
    session_cancel,
    session_fork,
    session_resume,
    timers_fire_due,
)
from tests.factories import AgentFactory, ToolFactory, UserFactory
from tests.fakes.fixtures import fake_servers, openai_server, unique  # noqa: F401
from tests.fakes.model_servers import Call, FakeModelServer, Reply
from tests.row_locks import session_row_locked
from tests.tools.http_server import Answer, ScriptedApi
from tools.models import Tool
from tools.registry import tool_handler

pytestmark = pytest.mark.django_db(transaction=True)

CRASHED = "crashed-worker:1:1:dead"


# Python tools with an effect log of their own, and their probes ---------------------------

EFFECTS: dict[str, dict[str, Any]] = {}


@tool_handler("tests.durability.grant", wants_idempotency_key=True)
def _grant(amount: int, idempotency_key: str) -> dict[str, Any]:
    result = {"ok": True, "code": f"G-{len(EFFECTS) + 1}", "amount": amount}
    EFFECTS[idempotency_key] = result
    return result


# Registered as a plain handler: a probe takes the key by definition.
@tool_handler("tests.durability.grant_probe")
def _grant_probe(idempotency_key: str) -> Any:
    return EFFECTS.get(idempotency_key)


@tool_handler("tests.durability.broken_probe")
def _broken_probe(idempotency_key: str) -> Any:
    raise ConnectionError("the ledger is down")


GATE = threading.Event()
ENTERED = threading.Event()


@tool_handler("tests.durability.gated")
def _gated() -> dict[str, Any]:
    """A slow tool: runs until the test opens the gate."""
    ENTERED.set()
    GATE.wait(10)
    return {"ok": True, "code": "gated"}


@pytest.fixture(autouse=True)
def _clean_effects() -> Iterator[None]:
    EFFECTS.clear()
    yield
    EFFECTS.clear()


@pytest.fixture(autouse=True)
def _no_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests drive the run here: no broker message may wake a worker of a live stack."""
    monkeypatch.setattr("record.dispatch.run_enqueue_on_commit", lambda *args: None)
    monkeypatch.setattr("record.dispatch.run_enqueue", lambda *args: None)


# Helpers ------------------------------------------------------------------------------------


def _rules(tool: str, args: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {"when": {"user": "go", "last_tool": None}, "tool_calls": [{"tool": tool, "args": args}]},
        {"when": {"last_tool": tool, "truthy": "result.ok"}, "answer": "done: {{ result.code }}"},
        {"when": {"last_tool": tool}, "answer": "not done: {{ result.error }}"},
    ]


def _agent_with(tool: Tool, model: ModelEndpoint, **fields: Any) -> Agent:
    fields.setdefault("rules", _rules(tool.name, {"amount": 5}))
    agent: Agent = AgentFactory.create(
        slug=f"durable-{uuid.uuid4().hex[:8]}", model=model, tools=[tool.name], **fields
    )
    return agent


def _session(make_session: Callable[..., Session], agent: Agent) -> Session:
    return make_session(agent=agent)


def _crash_after_dispatch(session: Session, *, dispatched: bool = True) -> ToolCall:
    """Run the model step as a worker that then dies having sent (or not) the side-effecting call.

    Leaves what the crash leaves: the intent committed (tool_wait), the call
    marked dispatched, and a lease that has run out.
    """
    message_post(session=session, content="go")
    assert lease_acquire(session_id=session.pk, owner=CRASHED, seconds=30)
    model_step(Session.objects.get(pk=session.pk), CRASHED)
    call = ToolCall.objects.get(session=session)
    assert (call.status, Session.objects.get(pk=session.pk).state) == ("executing", "tool_wait")
    if dispatched:
        ToolCall.objects.filter(pk=call.pk).update(dispatched_at=timezone.now())
    Session.objects.filter(pk=session.pk).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    call.refresh_from_db()
    return call


def _recover(session: Session, waits: list[float] | None = None) -> Session:
    """Run the session as a replacement worker would, through the waits of probes that
    could not tell (each a deferred step: the lease lapses later, the sweeper requeues);
    `waits` gets each wait's length in seconds."""
    while True:
        result = session_run(session_id=session.pk)
        if result.stopped != "deferred":
            break
        row = Session.objects.get(pk=session.pk)
        assert row.lease_owner is None and row.state == "tool_wait"
        if waits is not None:
            waits.append(round((_when(row.lease_expires_at) - timezone.now()).total_seconds()))
        Session.objects.filter(pk=session.pk).update(
            lease_expires_at=timezone.now() - timedelta(seconds=1)
        )
    assert result.stopped == "idle", result
    return Session.objects.get(pk=session.pk)


def _when(value: datetime | None) -> datetime:
    assert value is not None
    return value


def _checkpoint_steps(session: Session) -> list[int]:
    return list(
        Checkpoint.objects.filter(session=session).order_by("id").values_list("step", flat=True)
    )


def _http_tool(api: ScriptedApi, *, idempotent: bool, probe: bool = True) -> Tool:
    tool: Tool = ToolFactory.create(
        name=f"pay_{uuid.uuid4().hex[:8]}",
        kind="http",
        url=api.url("/pay"),
        status_url=api.url("/pay/status") if probe else "",
        method="POST",
        side_effects=True,
        idempotent=idempotent,
        timeout_s=5,
        parameters={
            "type": "object",
            "properties": {"amount": {"type": "integer"}},
            "required": ["amount"],
        },
    )
    return tool


def _python_tool(*, idempotent: bool, probe: str) -> Tool:
    tool: Tool = ToolFactory.create(
        name=f"grant_{uuid.uuid4().hex[:8]}",
        kind="python",
        handler="tests.durability.grant",
        probe_handler=probe,
        side_effects=True,
        idempotent=idempotent,
        parameters={
            "type": "object",
            "properties": {"amount": {"type": "integer"}},
            "required": ["amount"],
        },
    )
    return tool


# Probes of an HTTP tool: done / not done / cannot tell, idempotent or not -------------------

DONE = Answer(200, {"status": "done", "result": {"ok": True, "code": "C-1", "amount": 5}})
NOT_DONE = Answer(404, {"status": "unknown"})
CANNOT_TELL = Answer(503, {"error": "status store unavailable"})
SENT = Answer(201, {"ok": True, "code": "C-2", "amount": 5})


@pytest.mark.parametrize("idempotent", [True, False], ids=["idempotent", "not-idempotent"])
def test_a_probe_that_says_done_gives_the_result_without_sending_again(
    make_session, rules_model, idempotent
):
    with ScriptedApi() as api:
        api.script(DONE)
        tool = _http_tool(api, idempotent=idempotent)
        session = _session(make_session, _agent_with(tool, rules_model))
        call = _crash_after_dispatch(session)

        session = _recover(session)

        seen = [
            (r.method, r.path, r.query.get("idempotency_key"), r.headers.get("idempotency-key"))
            for r in api.requests
        ]
    assert seen == [("GET", "/pay/status", call.idempotency_key, call.idempotency_key)]
    call.refresh_from_db()
    assert (call.status, call.probe_outcome, (call.output or {})["code"]) == (
        "success",
        "done",
        "C-1",
    )
    assert session.state == "finished"
    answer = Message.objects.filter(session=session, role="assistant").latest("seq")
    assert answer.content == "done: C-1"
    probed = [e.data for e in Event.objects.filter(session=session, type="tool.finished")]
    assert [(d["status"], d["probed"]) for d in probed] == [("success", "done")]


@pytest.mark.parametrize("idempotent", [True, False], ids=["idempotent", "not-idempotent"])
def test_a_probe_that_says_not_done_sends_again_with_the_same_key(
    make_session, rules_model, idempotent
):
    with ScriptedApi() as api:
        api.script(NOT_DONE, SENT)
        tool = _http_tool(api, idempotent=idempotent)
        session = _session(make_session, _agent_with(tool, rules_model))
        call = _crash_after_dispatch(session)

        session = _recover(session)

        seen = [(r.method, r.path, r.headers.get("idempotency-key")) for r in api.requests]
    assert seen == [
        ("GET", "/pay/status", call.idempotency_key),
        ("POST", "/pay", call.idempotency_key),
    ]
    assert api.requests[1].body == {"amount": 5}
    call.refresh_from_db()
    assert (call.status, call.probe_outcome, (call.output or {})["code"], call.attempts) == (
        "success",
        "not_done",
        "C-2",
        1,
    )
    assert session.state == "finished"


@pytest.mark.parametrize("probe", [True, False], ids=["probe-fails", "no-probe"])
def test_an_idempotent_tool_whose_probe_cannot_tell_is_sent_again_with_the_same_key(
    make_session, rules_model, probe
):
    with ScriptedApi() as api:
        api.script(*([CANNOT_TELL] * 3 if probe else []), SENT)
        tool = _http_tool(api, idempotent=True, probe=probe)
        session = _session(make_session, _agent_with(tool, rules_model))
        call = _crash_after_dispatch(session)

        waits: list[float] = []
        session = _recover(session, waits)

        posts = [
            (r.path, r.headers.get("idempotency-key")) for r in api.requests if r.method == "POST"
        ]
        probes = [r for r in api.requests if r.method == "GET"]
    assert posts == [("/pay", call.idempotency_key)]
    # A probe that cannot tell is asked again, backing off (5 s, then 10 s); no probe at
    # all has nothing to ask again.
    assert (len(probes), waits) == ((3, [5, 10]) if probe else (0, []))
    call.refresh_from_db()
    assert (call.status, call.probe_outcome, call.probes) == (
        "success",
        "unknown",
        3 if probe else 0,
    )
    assert session.state == "finished"


SAYS_UNKNOWN = Answer(200, {"status": "unknown"})


@pytest.mark.parametrize("idempotent", [True, False], ids=["idempotent", "not-idempotent"])
def test_a_probe_answering_unknown_is_asked_again_and_never_read_as_not_done(
    make_session, rules_model, idempotent
):
    """`{"status": "unknown"}` is the service saying it cannot tell yet, not "no": the
    probe is asked again after a backoff, then the call is not re-sent blindly. A call
    that is not idempotent goes to a person; an idempotent one goes again with its key."""
    with ScriptedApi() as api:
        api.script(*[SAYS_UNKNOWN] * 2, DONE if idempotent else SAYS_UNKNOWN, SENT)
        tool = _http_tool(api, idempotent=idempotent)
        session = _session(make_session, _agent_with(tool, rules_model))
        call = _crash_after_dispatch(session)

        waits: list[float] = []
        session = _recover(session, waits)

        seen = [r.method for r in api.requests]
    assert waits == [5, 10]
    call.refresh_from_db()
    if idempotent:
        # The third probe found the effect: settled with its result, never sent again.
        assert seen == ["GET", "GET", "GET"]
        assert (call.status, call.probe_outcome, call.probes) == ("success", "done", 2)
        assert session.state == "finished"
    else:
        assert seen == ["GET", "GET", "GET"]  # three probes, no POST
        assert (call.status, call.probe_outcome, call.probes) == ("executing", "unknown", 3)
        review = Approval.objects.get(session=session)
        assert "could not tell after 3 probes (the status URL answered: unknown)" in review.reason
        assert session.state == "awaiting_approval"


@pytest.mark.parametrize("probe", [True, False], ids=["probe-fails", "no-probe"])
def test_a_tool_that_is_not_idempotent_and_cannot_be_probed_goes_to_a_person(
    make_session, rules_model, probe
):
    with ScriptedApi() as api:
        api.script(*([CANNOT_TELL] * 3 if probe else []))
        tool = _http_tool(api, idempotent=False, probe=probe)
        session = _session(make_session, _agent_with(tool, rules_model))
        call = _crash_after_dispatch(session)

        waits: list[float] = []
        session = _recover(session, waits)

        posts = [r for r in api.requests if r.method == "POST"]
    assert posts == []  # never re-sent blindly
    assert waits == ([5, 10] if probe else [])
    assert (session.state, session.lease_owner) == ("awaiting_approval", None)
    review = Approval.objects.get(session=session)
    assert (review.kind, review.status, review.tool_call_id) == (
        "recovery_review",
        "pending",
        call.pk,
    )
    assert call.idempotency_key in review.reason and "take effect" in review.reason
    assert (
        "could not tell after 3 probes (status URL answered HTTP 503)" if probe else "has no probe"
    ) in review.reason
    call.refresh_from_db()
    assert (call.status, call.probe_outcome) == ("executing", "unknown")
    requested = Event.objects.filter(session=session).latest("seq")
    assert requested.type == "approval.requested" and requested.data["approval_id"] == str(
        review.pk
    )
    assert _checkpoint_steps(session) == list(range(1, session.step + 1))


@pytest.mark.parametrize(
    ("answer", "result", "posts", "reply"),
    [
        ("took_effect", {"ok": True, "code": "C-by-hand"}, 0, "done: C-by-hand"),
        ("not_taken", None, 0, "not done: alice checked: this call did not take effect"),
        ("send_again", None, 1, "done: C-2"),
    ],
)
def test_the_reviewers_answer_continues_the_run(
    make_session, rules_model, answer, result, posts, reply
):
    reviewer = UserFactory(username="alice")
    with ScriptedApi() as api:
        api.script(*[CANNOT_TELL] * 3, SENT)
        tool = _http_tool(api, idempotent=False)
        session = _session(make_session, _agent_with(tool, rules_model))
        call = _crash_after_dispatch(session)
        session = _recover(session)
        review = Approval.objects.get(session=session)

        review_answer(
            approval_id=review.pk,
            answer=answer,
            result=result,
            user=reviewer,
            groups=["approvers"],
        )
        assert Session.objects.get(pk=session.pk).state == "tool_wait"
        session = _recover(session)

        sent = [
            (r.path, r.headers.get("idempotency-key")) for r in api.requests if r.method == "POST"
        ]
    assert sent == [("/pay", call.idempotency_key)] * posts
    assert session.state == "finished"
    answer_text = Message.objects.filter(session=session, role="assistant").latest("seq").content
    assert answer_text.startswith(reply)
    review.refresh_from_db()
    assert (review.answer, review.decided_by_name) == (answer, "alice")
    with pytest.raises(Conflict):
        review_answer(
            approval_id=review.pk, answer="not_taken", user=reviewer, groups=["approvers"]
        )


def test_a_call_never_dispatched_is_simply_run_without_a_probe(make_session, rules_model):
    with ScriptedApi() as api:
        api.script(SENT)
        tool = _http_tool(api, idempotent=False)
        session = _session(make_session, _agent_with(tool, rules_model))
        call = _crash_after_dispatch(session, dispatched=False)

        session = _recover(session)

        seen = [(r.method, r.path) for r in api.requests]
    assert seen == [("POST", "/pay")]
    call.refresh_from_db()
    assert (call.status, call.probe_outcome) == ("success", "")
    assert call.dispatched_at is not None
    assert session.state == "finished"


# Probes of a Python tool ----------------------------------------------------------------------


def test_a_python_probe_that_finds_the_effect_returns_its_result(make_session, rules_model):
    tool = _python_tool(idempotent=False, probe="tests.durability.grant_probe")
    session = _session(make_session, _agent_with(tool, rules_model))
    call = _crash_after_dispatch(session)
    EFFECTS[call.idempotency_key] = {"ok": True, "code": "G-before-crash", "amount": 5}

    session = _recover(session)

    assert list(EFFECTS) == [call.idempotency_key]  # not executed again
    call.refresh_from_db()
    assert (call.status, call.probe_outcome, (call.output or {})["code"]) == (
        "success",
        "done",
        "G-before-crash",
    )
    assert Message.objects.filter(session=session, role="assistant").latest("seq").content == (
        "done: G-before-crash"
    )


@pytest.mark.parametrize("idempotent", [True, False], ids=["idempotent", "not-idempotent"])
def test_a_python_probe_that_finds_nothing_runs_the_call_once_with_its_key(
    make_session, rules_model, idempotent
):
    tool = _python_tool(idempotent=idempotent, probe="tests.durability.grant_probe")
    session = _session(make_session, _agent_with(tool, rules_model))
    call = _crash_after_dispatch(session)

    session = _recover(session)

    assert list(EFFECTS) == [call.idempotency_key]
    call.refresh_from_db()
    assert (call.status, call.probe_outcome) == ("success", "not_done")
    assert session.state == "finished"


@pytest.mark.parametrize(
    ("idempotent", "state", "effects"),
    [(True, "finished", 1), (False, "awaiting_approval", 0)],
    ids=["idempotent", "not-idempotent"],
)
def test_a_python_probe_that_fails_cannot_tell(
    make_session, rules_model, idempotent, state, effects
):
    tool = _python_tool(idempotent=idempotent, probe="tests.durability.broken_probe")
    session = _session(make_session, _agent_with(tool, rules_model))
    call = _crash_after_dispatch(session)

    session = _recover(session)

    assert len(EFFECTS) == effects
    call.refresh_from_db()
    assert call.probe_outcome == "unknown"
    assert session.state == state
    if state == "awaiting_approval":
        assert "probe failed: ConnectionError" in Approval.objects.get(session=session).reason


# Resume of a session that stopped in error, against a real (fake) OpenAI wire format ------------


def test_a_resumed_error_session_continues_with_a_well_formed_history(
    make_session,
    openai_server: FakeModelServer,  # noqa: F811
    unique: str,  # noqa: F811
    monkeypatch,
):
    monkeypatch.setenv("DURABILITY_MODEL_KEY", "sk-durability-0123456789")
    endpoint = ModelEndpoint.objects.create(
        name=f"fake-openai-{unique}", api="openai", base_url=openai_server.base_url, model="fake-model-1",
        api_key_env="DURABILITY_MODEL_KEY", first_token_timeout_s=5, total_timeout_s=10,
    )  # fmt: skip
    tool = _python_tool(idempotent=False, probe="")
    agent = _agent_with(tool, endpoint, rules=[])
    session = _session(make_session, agent)
    openai_server.script(Reply(calls=[Call(tool.name, {"amount": 5}, id="call_pay_1")]))
    call = _crash_after_dispatch(session)
    # An operator stopped the uncertain run rather than answer its review.
    assert lease_acquire(session_id=session.pk, owner="operator:1", seconds=30)
    turn_fail(
        Session.objects.get(pk=session.pk),
        "operator:1",
        f"stopped by an operator: {call.idempotency_key} is uncertain",
    )
    Session.objects.filter(pk=session.pk).update(lease_owner=None, lease_expires_at=None)
    session = Session.objects.get(pk=session.pk)
    assert session.state == "error" and EFFECTS == {}

    openai_server.script(Reply(text="I could not confirm the grant; an operator will check it."))
    session_resume(session=session, actor="operator")
    session = _recover(session)

    assert session.state == "finished", (session.state, session.last_error, openai_server.invalid)
    request = openai_server.requests[-1]
    tool_messages = [m for m in request.messages if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_messages] == ["call_pay_1"]
    assert call.idempotency_key in tool_messages[0]["content"]
    answer = Message.objects.filter(session=session, role="assistant").latest("seq")
    assert answer.content.startswith("I could not confirm")
    moves = list(
        Transition.objects.filter(session=session)
        .order_by("id")
        .values_list("trigger", "to_state", "actor")
    )
    assert ("resume", "tool_loop", "operator") in moves
    assert EFFECTS == {}  # the uncertain call was never re-sent
    assert _checkpoint_steps(session) == list(range(1, session.step + 1))


# A stale worker sends nothing and commits nothing ---------------------------------------------


def test_a_worker_whose_lease_was_taken_does_not_send_the_side_effecting_call(
    make_session, rules_model
):
    with ScriptedApi() as api:
        tool = _http_tool(api, idempotent=False)
        session = _session(make_session, _agent_with(tool, rules_model))
        _crash_after_dispatch(session, dispatched=False)
        stale = Session.objects.get(pk=session.pk)
        # The worker paused here; meanwhile its lease ran out and another worker took the session.
        Session.objects.filter(pk=session.pk).update(
            lease_owner="thief", lease_expires_at=timezone.now() + timedelta(minutes=1)
        )

        with pytest.raises(StaleSession):
            tool_step(stale, CRASHED)

        assert api.requests == []
    call = ToolCall.objects.get(session=session)
    assert (call.status, call.dispatched_at) == ("executing", None)


def test_a_stolen_lease_stops_the_run_and_its_commit_is_refused(
    make_session, make_agent, rules_model
):
    ModelEndpoint.objects.filter(pk=rules_model.pk).update(options={"latency_s": 1.0})
    session = make_session(agent=make_agent(rules=[{"answer": "Echo: {{ user }}"}]))
    message_post(session=session, content="hello")
    before = Session.objects.get(pk=session.pk)
    results: list[Any] = []

    def run() -> None:
        try:
            results.append(session_run(session_id=session.pk, owner="slow-worker"))
        finally:
            connection.close()

    runner = threading.Thread(target=run)
    runner.start()
    deadline = time.monotonic() + 5
    while Session.objects.get(pk=session.pk).lease_owner != "slow-worker":
        assert time.monotonic() < deadline
        time.sleep(0.02)
    # Mid model call: the lease is taken over (as after a pause longer than the lease).
    Session.objects.filter(pk=session.pk).update(
        lease_owner="thief", lease_expires_at=timezone.now() + timedelta(minutes=1)
    )
    runner.join(10)

    assert [(r.stopped, r.steps) for r in results] == [("lease_lost", 0)]
    after = Session.objects.get(pk=session.pk)
    assert (after.state, after.version, after.step, after.lease_owner) == (
        "processing",
        before.version,
        before.step,
        "thief",
    )
    assert not Message.objects.filter(session=session, role="assistant").exists()
    assert not ModelCall.objects.filter(session=session).exists()


# Interrupts between steps keep their reason and who asked ---------------------------------------


@pytest.mark.parametrize("how", ["cancel", "double_texting"])
def test_a_cancel_during_a_tool_keeps_its_reason_and_actor(make_session, rules_model, how):
    tool: Tool = ToolFactory.create(
        name=f"gated_{uuid.uuid4().hex[:8]}", handler="tests.durability.gated"
    )
    agent = _agent_with(tool, rules_model, rules=_rules(tool.name, {}), double_texting="interrupt")
    session = _session(make_session, agent)
    message_post(session=session, content="go")
    GATE.clear()
    ENTERED.clear()
    results: list[Any] = []

    def run() -> None:
        try:
            results.append(session_run(session_id=session.pk))
        finally:
            connection.close()

    runner = threading.Thread(target=run)
    runner.start()
    try:
        assert ENTERED.wait(10)
        if how == "cancel":
            assert (
                session_cancel(session=session, reason="stopped by an operator", actor="admin:ops")
                is True
            )
        else:
            message_post(session=session, content="something else")
    finally:
        GATE.set()
        runner.join(15)

    assert [r.stopped for r in results] == ["idle"]
    call = ToolCall.objects.get(session=session)
    assert (call.status, (call.output or {})["code"]) == (
        "success",
        "gated",
    )  # the running tool finished, recorded
    finished = [
        e.data for e in Event.objects.filter(session=session, type="turn.finished").order_by("seq")
    ]
    cancel = Transition.objects.get(session=session, trigger="cancel")
    if how == "cancel":
        assert [(d["stop_reason"], d["reason"]) for d in finished] == [
            ("cancelled", "stopped by an operator")
        ]
        assert (cancel.from_state, cancel.reason, cancel.actor) == (
            "tool_loop",
            "stopped by an operator",
            "admin:ops",
        )
    else:
        assert [(d["turn"], d["stop_reason"]) for d in finished] == [
            (1, "interrupted"),
            (2, "answer"),
        ]
        assert cancel.reason == "interrupted by a new message"
    assert (
        ModelCall.objects.filter(session=session, turn=1).count() == 1
    )  # no model step after the tool


# Leases and the heartbeat ----------------------------------------------------------------------


def _expiry(session: Session) -> Any:
    return Session.objects.values_list("lease_expires_at", flat=True).get(pk=session.pk)


def test_taking_a_lease_returns_the_row_as_a_fresh_read_gives_it(make_session):
    session = make_session(state="processing")
    Session.objects.filter(pk=session.pk).update(
        dialogue_state={"slots": {"size": 42}, "n": 1.5}, metadata={"k": ["v"]}, turn=3
    )

    taken = lease_take(session_id=session.pk, owner="me", seconds=30)

    assert taken is not None
    fresh = Session.objects.get(pk=session.pk)
    assert {f.attname: getattr(taken, f.attname) for f in Session._meta.concrete_fields} == {
        f.attname: getattr(fresh, f.attname) for f in Session._meta.concrete_fields
    }
    assert (taken.lease_owner, taken.dialogue_state["slots"]) == ("me", {"size": 42})
    # With its agent's configuration stamp, which the run's first step then trusts.
    with connection.cursor() as cursor:
        cursor.execute("SELECT agent_config_stamp(%s)", [session.agent_id])
        assert taken.config_stamp == (taken.version, cursor.fetchone()[0])  # type: ignore[attr-defined]
    # Held by another, or no work: nothing taken, no row.
    assert lease_take(session_id=session.pk, owner="other", seconds=30) is None
    idle = make_session(state="idle")
    assert lease_take(session_id=idle.pk, owner="me", seconds=30) is None


def test_leases_renew_moves_only_leases_still_held_by_their_owner(make_session):
    mine, taken = make_session(state="processing"), make_session(state="processing")
    assert lease_acquire(session_id=mine.pk, owner="me", seconds=2)
    assert lease_acquire(session_id=taken.pk, owner="other", seconds=2)
    before_taken = _expiry(taken)

    renewed = leases_renew([(str(mine.pk), "me"), (str(taken.pk), "me")], 30)

    assert renewed == 1
    assert _expiry(mine) > timezone.now() + timedelta(seconds=25)
    assert _expiry(taken) == before_taken


def test_leases_renew_skips_a_row_locked_by_a_step_in_flight_instead_of_waiting(make_session):
    """A session row another transaction holds (a step commit in flight) is skipped:
    the heartbeat neither waits for it nor holds the other rows locked meanwhile."""
    busy, free = make_session(state="processing"), make_session(state="processing")
    for session in (busy, free):
        assert lease_acquire(session_id=session.pk, owner="me", seconds=2)
    before_busy = _expiry(busy)

    with session_row_locked(busy.pk):
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '2s'")  # waiting would fail, not hang
        try:
            renewed = leases_renew([(str(busy.pk), "me"), (str(free.pk), "me")], 30)
        finally:
            with connection.cursor() as cursor:
                cursor.execute("RESET lock_timeout")

    assert renewed == 1
    assert _expiry(free) > timezone.now() + timedelta(seconds=25)
    assert _expiry(busy) == before_busy


def test_leases_renew_leaves_a_lease_with_time_to_spare_for_the_next_beat(make_session):
    recent, due = make_session(state="processing"), make_session(state="processing")
    assert lease_acquire(session_id=recent.pk, owner="me", seconds=20)
    assert lease_acquire(session_id=due.pk, owner="me", seconds=2)
    before_recent = _expiry(recent)

    renewed = leases_renew([(str(recent.pk), "me"), (str(due.pk), "me")], 30, due_within=10)

    assert renewed == 1
    assert _expiry(recent) == before_recent  # 20 s left: more than 10
    assert _expiry(due) > timezone.now() + timedelta(seconds=25)


def test_the_heartbeat_renews_held_leases_until_released(make_session, settings):
    settings.SESSION_LEASE_S = 0.6  # renewed every 0.15 s
    session = make_session(state="processing")
    assert lease_acquire(session_id=session.pk, owner="me", seconds=0.6)
    beat = Heartbeat()
    beat.hold(session.pk, "me")
    try:
        time.sleep(1.5)  # more than twice the lease
        assert _expiry(session) > timezone.now()
        assert Session.objects.get(pk=session.pk).lease_owner == "me"
    finally:
        beat.release(session.pk)
    time.sleep(0.9)
    assert _expiry(session) < timezone.now()  # no longer renewed: the sweeper may take it


# Checkpoints -----------------------------------------------------------------------------------


def test_every_step_checkpoints_a_compact_execution_context(make_session, rules_model):
    tool = _python_tool(idempotent=True, probe="")
    agent = _agent_with(tool, rules_model)
    session = _session(make_session, agent)
    message_post(session=session, content="go")
    after_post = list(Checkpoint.objects.filter(session=session))
    assert [(c.step, c.context["phase"], c.message_seq) for c in after_post] == [
        (1, "turn_start", 1)
    ]

    session = _recover(session)

    checkpoints = list(Checkpoint.objects.filter(session=session).order_by("step"))
    assert [c.step for c in checkpoints] == list(range(1, session.step + 1))
    # The grant moves money (`amount`): risk level 2, so a checkpoint commits before it
    # runs (that step moves no state); the tool results' commit also makes the move back
    # to the model (two transitions, one commit, one checkpoint).
    moves = Transition.objects.filter(session=session).order_by("id")
    assert [(t.trigger, t.version) for t in moves] == [
        ("user_message", 1),
        ("tool_calls", 2),
        # version 3 is the pre_run checkpoint's step
        ("tool_results", 4),
        ("model_call", 5),
        ("answer", 6),
    ]
    phases = [c.context["phase"] for c in checkpoints]
    assert phases == ["turn_start", "tool_intent", "pre_run", "tool_results", "answer"]
    by_phase = {c.context["phase"]: c for c in checkpoints}
    call = ToolCall.objects.get(session=session)
    intent = by_phase["tool_intent"].context
    assert intent["pending"] == [[call.call_id, call.idempotency_key]]
    assert intent["model"] == rules_model.name and intent["iteration"] == 1 and intent["turn"] == 1
    assert intent["deadline"] == pytest.approx(
        _when(session.turn_started_at).timestamp() + agent.turn_timeout_s
    )
    assert set(intent["env"]) == {"agent", "tools", "model"}  # the environment, first time only
    assert "env" not in by_phase["answer"].context
    assert by_phase["tool_results"].context["done"] == [[call.call_id, "success", 1]]
    assert (call.risk_level, call.risk_reason) == (2, "side effect with money-like amount")
    assert by_phase["pre_run"].context["pre_run"] == [
        {
            "call_id": call.call_id,
            "tool": tool.name,
            "risk_level": 2,
            "why": "side effect with money-like amount",
            "arguments": {"amount": 5},
            "idempotency_key": call.idempotency_key,
            "idempotent": True,
            "probe": {"kind": "none"},
            "env_fingerprint": by_phase["tool_intent"].fingerprint,
        }
    ]
    assert [c.message_seq for c in checkpoints] == [1, 2, 2, 3, 4]
    assert [c.state for c in checkpoints] == [
        "processing",
        "tool_wait",
        "tool_wait",
        "processing",
        "finished",
    ]
    assert all(c.fingerprint == by_phase["tool_intent"].fingerprint for c in checkpoints[1:])
    assert len(by_phase["tool_intent"].fingerprint) == 64
    assert max(c.size_bytes for c in checkpoints) <= 2048


def test_a_fork_runs_on_from_its_checkpoint_and_is_told_that_the_model_changed(
    make_session, rules_model
):
    tool = _python_tool(idempotent=True, probe="")
    agent = _agent_with(tool, rules_model)
    original = _session(make_session, agent)
    message_post(session=original, content="go")
    original = _recover(original)
    middle = Checkpoint.objects.get(session=original, context__phase="tool_results")
    untouched = (original.version, original.step, Message.objects.filter(session=original).count())
    other = ModelEndpoint.objects.create(name=f"rules-b-{uuid.uuid4().hex[:6]}", api="rules")
    Agent.objects.filter(pk=agent.pk).update(model=other)

    fork = session_fork(session=original, step=middle.step, actor="api:owner")
    fork = _recover(fork)

    assert fork.state == "finished" and fork.forked_from_id == original.pk
    history = list(Message.objects.filter(session=fork).order_by("seq"))
    assert [m.role for m in history] == ["user", "assistant", "tool", "system", "assistant"]
    assert f"the model changed from {rules_model.name} to {other.name}" in history[3].content
    assert "configuration were changed" in history[3].content
    assert history[-1].content.startswith("done: G-")
    assert len(EFFECTS) == 1  # the fork reused the recorded result; the tool did not run again
    original = Session.objects.get(pk=original.pk)
    assert (
        original.version,
        original.step,
        Message.objects.filter(session=original).count(),
    ) == untouched
    assert _checkpoint_steps(fork) == list(range(1, fork.step + 1))


def test_celery_acknowledges_late_and_prefetches_one(settings):
    assert tasks.run_session.acks_late is True
    assert tasks.run_session.reject_on_worker_lost is True
    assert settings.CELERY_WORKER_PREFETCH_MULTIPLIER == 1
    assert settings.CELERY_TASK_ACKS_LATE is True
    assert settings.CELERY_BROKER_TRANSPORT_OPTIONS["visibility_timeout"] > 0


# Durable timers ----------------------------------------------------------------------------------


@pytest.fixture
def timer_agent(rules_model: ModelEndpoint) -> Agent:
    ToolFactory(
        name="schedule_followup",
        handler="builtin.schedule_followup",
        side_effects=True,
        parameters={
            "type": "object",
            "properties": {"after_seconds": {"type": "integer"}, "note": {"type": "string"}},
            "required": ["after_seconds", "note"],
        },
    )
    agent: Agent = AgentFactory.create(
        slug=f"timer-{uuid.uuid4().hex[:8]}",
        model=rules_model,
        tools=["schedule_followup"],
        rules=[
            {"when": {"last_tool": "schedule_followup", "note": "follow-up you scheduled is due"},
             "answer": "Reminder: {{ tools.schedule_followup.note }}"},
            {"when": {"user": "remind me in (\\d+) seconds to (.+)", "last_tool": None},
             "tool_calls": [{"tool": "schedule_followup", "args": {"after_seconds": "{{ match.1 }}", "note": "{{ match.2 }}"}}]},
            {"answer": "?"},
        ],
    )  # fmt: skip
    return agent


def test_a_timer_waits_in_the_database_and_the_sweeper_wakes_it(make_session, timer_agent):
    session = make_session(agent=timer_agent)
    message_post(session=session, content="remind me in 600 seconds to call the courier")
    session = _recover(session)
    assert session.state == "waiting_timer" and session.lease_owner is None
    assert _when(session.timer_due_at) > timezone.now() + timedelta(seconds=590)
    assert session.timer_note == "call the courier"
    assert timers_fire_due() == []  # not due yet

    Session.objects.filter(pk=session.pk).update(timer_due_at=timezone.now() - timedelta(seconds=1))
    assert timers_fire_due() == [str(session.pk)]
    assert timers_fire_due() == []  # fired once
    session = _recover(session)

    assert session.state == "finished" and session.timer_due_at is None and session.timer_note == ""
    answer = Message.objects.filter(session=session, role="assistant").latest("seq")
    assert answer.content == "Reminder: call the courier"
    note = Message.objects.get(session=session, role="system")
    assert "call the courier" in note.content
    triggers = list(
        Transition.objects.filter(session=session).order_by("id").values_list("trigger", flat=True)
    )
    assert triggers == [
        "user_message",
        "tool_calls",
        "timer_set",
        "timer_fired",
        "model_call",
        "answer",
    ]
    assert _checkpoint_steps(session) == list(range(1, session.step + 1))


def test_a_timer_due_long_after_the_turn_began_still_gets_a_full_turn(make_session, timer_agent):
    """Waiting for a timer is not running: the woken turn is not past its time limit."""
    session = make_session(agent=timer_agent)
    message_post(session=session, content="remind me in 7200 seconds to call the courier")
    session = _recover(session)
    assert session.state == "waiting_timer"
    # Two hours later (the agent's turn limit is 600 s).
    Session.objects.filter(pk=session.pk).update(
        timer_due_at=timezone.now() - timedelta(seconds=1),
        turn_started_at=timezone.now() - timedelta(hours=2),
    )
    assert timers_fire_due() == [str(session.pk)]

    session = _recover(session)

    finished = Event.objects.filter(session=session, type="turn.finished").get()
    assert finished.data["stop_reason"] == "answer", finished.data
    answer = Message.objects.filter(session=session, role="assistant").latest("seq")
    assert answer.content == "Reminder: call the courier"


def test_cancel_clears_a_waiting_timer(make_session, timer_agent):
    session = make_session(agent=timer_agent)
    message_post(session=session, content="remind me in 1 seconds to check the parcel")
    session = _recover(session)
    assert session.state == "waiting_timer"

    assert session_cancel(session=session, actor="api:owner") is True

    session = Session.objects.get(pk=session.pk)
    assert (session.state, session.timer_due_at, session.timer_note) == ("cancelled", None, "")
    time.sleep(1.2)
    assert timers_fire_due() == []
    move = Transition.objects.filter(session=session).latest("id")
    assert (move.trigger, move.to_state, move.actor) == ("cancel", "cancelled", "api:owner")


# Retention ------------------------------------------------------------------------------------------


def _checkpoints(session: Session, turn: int, steps: range, age: timedelta) -> None:
    for step in steps:
        row = Checkpoint.objects.create(
            session=session, step=step, turn=turn, state="processing", message_seq=step, context={}
        )
        Checkpoint.objects.filter(pk=row.pk).update(created_at=timezone.now() - age)


def test_prune_checkpoints_keeps_the_latest_per_session_and_only_drops_old_finished_turns(
    make_session, settings
):
    settings.CHECKPOINT_RETENTION_DAYS = 30
    old, recent = timedelta(days=40), timedelta(days=1)
    finished = make_session(state="finished", turn=2, step=6)
    _checkpoints(finished, 1, range(1, 4), old)
    _checkpoints(finished, 2, range(4, 7), old)
    running = make_session(state="waiting_timer", turn=2, step=6)
    _checkpoints(running, 1, range(1, 4), old)  # an earlier, finished turn
    _checkpoints(running, 2, range(4, 7), old)  # the turn still going on
    young = make_session(state="finished", turn=1, step=3)
    _checkpoints(young, 1, range(1, 4), recent)

    call_command("prune_checkpoints")

    def steps(session: Session) -> list[int]:
        return sorted(Checkpoint.objects.filter(session=session).values_list("step", flat=True))

    assert steps(finished) == [6]  # the latest stays
    assert steps(running) == [4, 5, 6]  # its current turn is untouched
    assert steps(young) == [1, 2, 3]  # not old enough
    assert Session.objects.get(pk=finished.pk).step == 6

    # The beat task does the same with the same retention; a shorter age on the command line reaches further.
    assert tasks.prune_checkpoints() == 0
    assert checkpoints_prune(older_than_days=0.5) == 2
    assert steps(young) == [3]


def test_a_message_is_committed_before_post_returns(make_session):
    session = make_session()
    posted = message_post(session=session, content="durable?", idempotency_key="k-1")

    # A connection of its own sees the row: it is committed, not pending in a transaction.
    seen: list[Any] = []

    def look() -> None:
        try:
            seen.append(
                Message.objects.filter(pk=posted.message.pk)
                .values_list("content", "seq", "status")
                .first()
            )
        finally:
            connection.close()

    reader = threading.Thread(target=look)
    reader.start()
    reader.join(5)
    assert seen == [("durable?", 1, "final")]
    again = message_post(session=session, content="durable?", idempotency_key="k-1")
    assert (again.created, again.message.pk) == (False, posted.message.pk)
