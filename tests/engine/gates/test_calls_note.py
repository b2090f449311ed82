"""The model is told plainly when calls did not run: one platform note right after tool
results where calls were rejected, expired, unpaid or failed (engine/gates/guards.py `calls_note`),
checked on the note's text and in the request a scripted model receives."""

import threading
from typing import Any

import pytest

from accounts.services import api_key_create, approver_grant
from approvals.models import Approval
from billing.services import credits_grant
from engine import session_run
from engine.gates.guards import NOTE_NAME, CallRecord, calls_note, note_text
from record.models import Agent, Message, ModelEndpoint, Session, ToolCall
from sessions.services import approval_decide, message_post
from tests.demo_setup import DEMO_REQUEST, demo_install
from tests.factories import AgentFactory, SessionFactory, ToolFactory, UserFactory
from tests.fakes.fixtures import fake_servers, openai_server, unique  # noqa: F401
from tests.fakes.model_servers import Call, FakeModelServer, Recorded, Reply
from tools.registry import tool_handler

KEY_ENV = "CALLS_NOTE_MODEL_KEY"
SENT: list[int] = []
_lock = threading.Lock()


@tool_handler("tests.calls_note.notify")
def _notify(customer: int) -> dict[str, Any]:
    with _lock:
        SENT.append(customer)
    return {"notification": f"N-{customer}"}


def _record(tool: str, status: str, refusal: str = "") -> CallRecord:
    return CallRecord(tool, {}, None, status, refusal)


def test_every_call_done_gives_no_note():
    assert note_text([_record("notify", "success"), _record("report", "success")]) is None


def test_the_note_says_per_tool_how_many_did_not_run_and_why():
    text = note_text(
        [
            *[_record("send_notification", "rejected", "rejected")] * 3,
            _record("issue_coupon", "success"),
            _record("issue_coupon", "timeout"),
            _record("lookup", "rejected", "unpaid"),
            _record("lookup", "rejected", "expired"),
        ]
    )
    assert text is not None
    assert "3 of 3 send_notification calls did NOT run (rejected by an approver)" in text
    assert (
        "1 of 2 issue_coupon calls did NOT succeed "
        "(timed out: whether it took effect is unknown)" in text
    )
    assert (
        "2 of 2 lookup calls did NOT run "
        "(1 not enough credit points, 1 no approver decided before the deadline)"
        in text
        or "2 of 2 lookup calls did NOT run "
        "(1 no approver decided before the deadline, 1 not enough credit points)"
        in text
    )
    assert "do not say or imply that the others happened" in text


def _message(role: str, **fields: Any) -> Message:
    return Message(role=role, content=fields.pop("content", "x"), **fields)


def test_the_note_comes_once_right_after_the_results():
    calls = [[_record("notify", "rejected", "rejected")]]
    results = [_message("user"), _message("assistant"), _message("tool"), _message("tool")]
    session = Session(turn=1)

    note = calls_note(session, results, lambda: calls).contribution.notes
    assert [n.name for n in note] == [NOTE_NAME]
    # Given once: the history that holds it (or the model's next words) gets none.
    assert not calls_note(session, [*results, *note], lambda: calls).contribution.notes
    assert not calls_note(
        session, [*results, _message("assistant")], lambda: calls
    ).contribution.notes
    # Not after a user message, and the turn's calls are not even read then.
    asked: list[bool] = []
    assert not calls_note(
        session, [_message("user")], lambda: asked.append(True) or calls
    ).contribution.notes
    assert asked == []


# --- On the engine, with a scripted model -----------------------------------------------


runs_a_turn = pytest.mark.django_db(transaction=True)


@pytest.fixture
def scripted_agent(
    openai_server: FakeModelServer,  # noqa: F811
    unique: str,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    transactional_db: None,
) -> Any:
    SENT.clear()
    monkeypatch.setenv(KEY_ENV, "sk-calls-note-0123456789")
    endpoint = ModelEndpoint.objects.create(
        name=f"calls-note-{unique}",
        api="openai",
        base_url=openai_server.base_url,
        model="fake-model-1",
        api_key_env=KEY_ENV,
        first_token_timeout_s=5.0,
        total_timeout_s=10.0,
    )
    ToolFactory(
        name="notify",
        handler="tests.calls_note.notify",
        side_effects=True,
        requires_approval=True,
        parameters={
            "type": "object",
            "properties": {"customer": {"type": "integer"}},
            "required": ["customer"],
            "additionalProperties": False,
        },
    )
    return AgentFactory(model=endpoint, system_prompt="Notify customers.", tools=["notify"])


def _notify_three_then_answer(recorded: Recorded) -> Reply:
    if recorded.tool_results():
        return Reply(text="All three customers were notified.")  # a careless model
    return Reply(calls=[Call("notify", {"customer": n}) for n in (1, 2, 3)])


@runs_a_turn
def test_a_scripted_model_reads_the_note_after_an_approver_rejected_every_call(
    scripted_agent,
    openai_server,  # noqa: F811
):
    issued = api_key_create(username="alice", roles=["support"])
    approver_grant(username="alice")
    session = SessionFactory(agent=scripted_agent, owner=UserFactory())
    openai_server.script(_notify_three_then_answer, _notify_three_then_answer)
    message_post(session=session, content="tell the three customers about the delay")
    assert session_run(session_id=session.pk).stopped == "idle"
    approvals = list(Approval.objects.filter(session=session))
    assert len(approvals) == 3
    for approval in approvals:
        approval_decide(
            approval_id=approval.pk,
            approve=False,
            user=issued.api_key.owner,
            groups=["approvers"],
            comment="not today",
        )
    assert session_run(session_id=session.pk).stopped == "idle"

    assert SENT == []
    second = openai_server.requests[1].messages
    roles = [m["role"] for m in second]
    notes = [
        m["content"] for m in second if m["role"] == "system" and "did NOT run" in m["content"]
    ]
    assert len(notes) == 1
    assert "3 of 3 notify calls did NOT run (rejected by an approver)" in notes[0]
    # After the three results, before the model's answer.
    where = next(i for i, m in enumerate(second) if m["content"] == notes[0])
    assert roles[where - 3 : where] == ["tool", "tool", "tool"]
    # The note is history: committed with the step, as the model saw it.
    stored = Message.objects.get(session=session, name=NOTE_NAME)
    assert stored.role == "system" and stored.content == notes[0]
    assert set(ToolCall.objects.filter(session=session).values_list("refusal", flat=True)) == {
        "rejected"
    }


@runs_a_turn
def test_the_demo_tells_the_truth_when_its_notifications_could_not_be_paid_for():
    """The issue's case: every notification was refused, and the demo's answer had said
    "notified each customer (3 notifications sent)"."""
    demo_install()
    owner = UserFactory()
    credits_grant(owner_id=owner.pk, points=5, actor="test")  # a notification costs 10
    session = SessionFactory(
        agent=Agent.objects.get(slug="order-support"), owner=owner, role="support"
    )
    message_post(session=session, content=DEMO_REQUEST)
    assert session_run(session_id=session.pk).stopped == "idle"

    session.refresh_from_db()
    refused = ToolCall.objects.filter(session=session, tool_name="send_notification")
    assert refused.count() == 3
    assert set(refused.values_list("status", "refusal")) == {("rejected", "unpaid")}
    # The rules model read the note (committed with its step, as every request's history).
    note = Message.objects.get(session=session, name=NOTE_NAME)
    assert "3 of 3 send_notification calls did NOT run (not enough credit points)" in note.content
    answer = Message.objects.filter(session=session, role="assistant").latest("seq").content
    assert "notified each customer" not in answer
    assert "none of the 3 notifications could be sent: no customer was notified" in answer
    assert session.last_turn_outcome == "tool_failures"
    assert session.last_turn_calls == {
        "ok": 2, "failed": 0, "rejected": 0, "expired": 0, "unpaid": 3
    }  # fmt: skip
