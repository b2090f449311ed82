"""Human takeover: force-finish a waiting turn, reply as the operator, run a tool by hand, hand back."""

import uuid
from typing import Any

import pytest

from accounts.services import approver_grant
from approvals.models import Approval
from billing.models import CreditAccount
from billing.services import credits_grant
from engine import session_run
from engine.phases import tools as tool_phase
from record.errors import Conflict, Forbidden, InvalidInput
from record.models import Event, Message, Session, ToolCall, Transition
from sessions.services import (
    approval_decide,
    message_post,
    session_force_finish,
    session_hand_back,
    session_operator_reply,
    session_operator_tool_run,
)
from tests.factories import ToolFactory, UserFactory
from tools.models import Tool
from tools.registry import tool_handler

pytestmark = pytest.mark.django_db(transaction=True)
SENT: list[dict[str, Any]] = []


@tool_handler("tests.takeover.note", wants_idempotency_key=True)
def _note(text: str, idempotency_key: str = "") -> dict[str, Any]:
    SENT.append({"text": text, "key": idempotency_key})
    return {"noted": text}


ECHOED = "login jane.roe@example.org password=hunter2-Secret card 4242 4242 4242 4242"


@tool_handler("tests.takeover.ledger")
def _ledger() -> dict[str, Any]:
    raise RuntimeError(f"the ledger refused: {ECHOED}")


RULES = [
    {"when": {"user": "^wait", "last_tool": None},
     "tool_calls": [{"tool": "ask_user", "args": {"question": "Sure?"}}]},
    {"when": {"last_tool": "note"}, "answer": "The note says {{ result.noted }}"},
    {"answer": "Hello"},
]  # fmt: skip


@pytest.fixture(autouse=True)
def _no_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("record.dispatch.run_enqueue_on_commit", lambda *args: None)
    SENT.clear()


@pytest.fixture
def session(make_session, make_agent) -> Session:  # type: ignore[no-untyped-def]
    ToolFactory(
        name="note",
        handler="tests.takeover.note",
        side_effects=True,
        roles=["support"],
        parameters={
            "type": "object",
            "properties": {"text": {"type": "string", "maxLength": 20}},
            "required": ["text"],
        },
    )
    agent = make_agent(slug=f"take-{uuid.uuid4().hex[:6]}", tools=["ask_user", "note"], rules=RULES)
    made: Session = make_session(agent=agent, role="support")
    return made


def _run(session: Session) -> Session:
    assert session_run(session_id=session.pk).stopped == "idle"
    return Session.objects.get(pk=session.pk)


def test_force_finish_ends_a_waiting_turn_with_the_operators_answer(session):
    message_post(session=session, content="wait for me")
    session = _run(session)
    assert session.state == "paused_for_user"

    session_force_finish(session=session, content="We will call you.", actor="admin:op")
    session = Session.objects.get(pk=session.pk)
    assert session.state == "finished"
    answer = Message.objects.filter(session=session).latest("seq")
    assert (answer.role, answer.content, answer.data) == (
        "assistant",
        "We will call you.",
        {"from": "operator", "by": "admin:op"},
    )
    assert ToolCall.objects.get(session=session).status == "rejected"  # the question closed
    finished = Event.objects.filter(session=session, type="turn.finished").latest("seq").data
    assert finished["stop_reason"] == "operator"
    move = Transition.objects.filter(session=session).latest("id")
    assert (move.trigger, move.actor) == ("operator_answer", "admin:op")
    with pytest.raises(Conflict):
        session_force_finish(session=session, content="again", actor="admin:op")


def test_takeover_reply_and_tool_run_then_hand_back(session):
    message_post(session=session, content="hi")
    session = _run(session)
    assert session.state == "finished"

    session_operator_reply(session=session, content="An operator here.", actor="admin:op")
    call = session_operator_tool_run(
        session=session, tool_name="note", arguments={"text": "by hand"}, actor="admin:op"
    )
    # The intent is committed and the session waits for a worker's tool step, as a model's call.
    assert (call.status, Session.objects.get(pk=session.pk).state) == ("executing", "tool_wait")
    assert SENT == []
    session = _run(session)
    call.refresh_from_db()
    assert (call.status, call.output) == ("success", {"noted": "by hand"})
    assert [{"text": "by hand", "key": call.idempotency_key}] == SENT
    assert call.idempotency_key.endswith(call.call_id) and call.dispatched_at is not None
    assert call.risk_level is not None  # assessed like any call
    # Its result ends the turn again: the model does not decide until handed back.
    assert session.state == "finished"
    finished = Event.objects.filter(session=session, type="turn.finished").latest("seq").data
    assert finished["stop_reason"] == "operator"
    history = list(Message.objects.filter(session=session).order_by("seq"))
    assert [(m.role, (m.data or {}).get("from")) for m in history[-3:]] == [
        ("assistant", "operator"),
        ("assistant", "operator"),
        ("tool", None),
    ]
    assert history[-2].tool_calls[0]["id"] == call.call_id == history[-1].tool_call_id
    types = list(
        Event.objects.filter(session=session).order_by("seq").values_list("type", flat=True)
    )
    assert types[-9:] == [
        "message.completed",  # the reply
        "state.changed",  # finished -> tool_wait
        "message.completed",  # the hand-run request
        "tool.started",
        "state.changed",  # tool_wait -> tool_loop
        "state.changed",  # tool_loop -> finished
        "message.completed",  # its result
        "tool.finished",
        "turn.finished",
    ]
    moves = list(
        Transition.objects.filter(session=session).order_by("id").values_list("trigger", flat=True)
    )
    assert moves[-3:] == ["operator_tool", "tool_results", "operator_done"]

    session_hand_back(session=Session.objects.get(pk=session.pk), actor="admin:op")
    session = Session.objects.get(pk=session.pk)
    assert session.state == "tool_loop"
    session = _run(session)
    assert session.state == "finished"
    answer = Message.objects.filter(session=session, role="assistant").latest("seq")
    assert answer.content == "The note says by hand" and not (answer.data or {}).get("from")


def test_a_hand_run_goes_through_validation_role_gating_and_turn_checks(session):
    with pytest.raises(InvalidInput):
        session_operator_tool_run(session=session, tool_name="note", arguments=[], actor="op")
    with pytest.raises(Forbidden):  # the model's question to the user is not run by hand
        session_operator_tool_run(
            session=session, tool_name="ask_user", arguments={"question": "?"}, actor="op"
        )
    bad = session_operator_tool_run(
        session=session, tool_name="note", arguments={"text": "x" * 50}, actor="op"
    )
    _run(session)
    bad.refresh_from_db()
    assert bad.status == "failed" and "text" in bad.error  # the schema said no; nothing ran
    assert SENT == []
    Session.objects.filter(pk=session.pk).update(role="guest")
    with pytest.raises(Forbidden):
        session_operator_tool_run(
            session=Session.objects.get(pk=session.pk),
            tool_name="note",
            arguments={"text": "hi"},
            actor="op",
        )
    Session.objects.filter(pk=session.pk).update(role="support", state="processing")
    with pytest.raises(Conflict):
        session_operator_reply(session=session, content="hi", actor="op")
    with pytest.raises(Conflict):
        session_operator_tool_run(
            session=session, tool_name="note", arguments={"text": "hi"}, actor="op"
        )
    with pytest.raises(InvalidInput):
        session_operator_reply(session=session, content="  ", actor="op")


def test_a_hand_run_of_a_gated_tool_waits_for_an_approver(session):
    Tool.objects.filter(name="note").update(requires_approval=True)
    approver = UserFactory(username="approver")
    approver_grant(username=approver.username)
    call = session_operator_tool_run(
        session=session, tool_name="note", arguments={"text": "gated"}, actor="admin:op"
    )
    session = _run(session)
    assert session.state == "awaiting_approval" and SENT == []
    approval = Approval.objects.get(tool_call_id=call.pk)
    assert approval.arguments == {"text": "gated"}

    approval_decide(
        approval_id=approval.pk, approve=True, user=approver, groups=["approvers"],
        arguments={"text": "edited"},
    )  # fmt: skip
    session = _run(Session.objects.get(pk=session.pk))
    assert session.state == "finished"
    assert [s["text"] for s in SENT] == ["edited"]  # what the approver approved ran


def test_a_rejected_hand_run_never_runs(session):
    Tool.objects.filter(name="note").update(requires_approval=True)
    approver = UserFactory(username="approver")
    approver_grant(username=approver.username)
    call = session_operator_tool_run(
        session=session, tool_name="note", arguments={"text": "no"}, actor="admin:op"
    )
    session = _run(session)
    approval_decide(
        approval_id=Approval.objects.get(tool_call_id=call.pk).pk, approve=False,
        user=approver, groups=["approvers"], comment="not by hand",
    )  # fmt: skip
    session = _run(Session.objects.get(pk=session.pk))
    call.refresh_from_db()
    assert (session.state, call.status, SENT) == ("finished", "rejected", [])
    assert "not by hand" in call.error


def test_a_hand_run_pays_credits_like_any_call(session):
    Tool.objects.filter(name="note").update(credit_cost=30)
    credits_grant(owner_id=session.owner_id, points=50, actor="test")
    first = session_operator_tool_run(
        session=session, tool_name="note", arguments={"text": "paid"}, actor="admin:op"
    )
    _run(session)
    second = session_operator_tool_run(
        session=Session.objects.get(pk=session.pk),
        tool_name="note",
        arguments={"text": "unpaid"},
        actor="admin:op",
    )
    _run(session)
    first.refresh_from_db()
    second.refresh_from_db()
    assert first.status == "success" and second.status != "success"
    assert "insufficient_credits" in str(second.output or second.error)
    assert [s["text"] for s in SENT] == ["paid"]
    assert CreditAccount.objects.get(owner_id=session.owner_id).balance == 20


PROBED: list[str] = []


# A probe takes the key by definition; it returns the call's result if it took effect.
@tool_handler("tests.takeover.note_probe")
def _note_probe(idempotency_key: str) -> Any:
    PROBED.append(idempotency_key)
    sent = [s for s in SENT if s["key"] == idempotency_key]
    return {"noted": sent[0]["text"]} if sent else None


class _Crash(BaseException):
    """Escapes the run loop like a killed worker: no error recorded, the lease left."""


def test_a_crash_between_a_hand_runs_two_commits_is_probed_like_any_call(session, monkeypatch):
    Tool.objects.filter(name="note").update(probe_handler="tests.takeover.note_probe")
    PROBED.clear()
    call = session_operator_tool_run(
        session=session, tool_name="note", arguments={"text": "once"}, actor="admin:op"
    )

    def crash(name: str) -> None:
        if name == "before_tool_results_commit":
            raise _Crash

    monkeypatch.setattr(tool_phase, "fault_point", crash)
    with pytest.raises(_Crash):
        session_run(session_id=session.pk)
    call.refresh_from_db()
    assert (call.status, call.dispatched_at is not None, len(SENT)) == ("executing", True, 1)

    monkeypatch.undo()
    Session.objects.filter(pk=session.pk).update(lease_owner=None, lease_expires_at=None)
    session = _run(session)  # the sweeper's takeover
    call.refresh_from_db()
    assert [call.idempotency_key] == PROBED
    assert (call.status, call.output, len(SENT)) == ("success", {"noted": "once"}, 1)
    assert call.probe_outcome and session.state == "finished"


def test_a_hand_run_tools_error_is_scrubbed_in_its_row_message_and_event(session):
    ToolFactory(name="ledger", handler="tests.takeover.ledger", parameters={"type": "object"})
    session.agent.tools = [*session.agent.tools, "ledger"]
    session.agent.save(update_fields=["tools"])
    call = session_operator_tool_run(session=session, tool_name="ledger", arguments={}, actor="op")
    _run(session)
    call.refresh_from_db()
    result = Message.objects.get(session=session, role="tool", tool_call_id=call.call_id)
    finished = Event.objects.get(session=session, type="tool.finished").data
    stored = [call.error, result.content, result.data, finished]
    assert call.status == "failed" and "[redacted:email]" in call.error
    for leak in ("jane.roe@example.org", "hunter2-Secret", "4242 4242 4242 4242"):
        assert leak not in str(stored), stored
