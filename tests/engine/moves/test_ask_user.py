"""The model asks the user (`ask_user`): the session pauses, the next message answers, the turn goes on."""

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from engine import session_run
from record.models import Event, Message, Session, ToolCall, Transition
from sessions.services import message_post, questions_expire_due, session_cancel
from tests.factories import AgentFactory, ModelEndpointFactory, SessionFactory, UserFactory

pytestmark = pytest.mark.django_db(transaction=True)

RULES = [
    {"when": {"user": "^ship", "last_tool": None},
     "tool_calls": [{"tool": "ask_user", "args": {
         "question": "Which speed?", "options": ["fast", "slow"],
         "deadline_s": 60, "default_answer": "slow"}}]},
    {"when": {"last_tool": "ask_user"}, "answer": "Shipping {{ result.answer }}"},
    {"answer": "?"},
]  # fmt: skip


@pytest.fixture(autouse=True)
def _no_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """The test drives the run itself: no broker message may wake a worker of a live stack."""
    monkeypatch.setattr("record.dispatch.run_enqueue_on_commit", lambda *args: None)


@pytest.fixture
def session(db) -> Session:  # type: ignore[no-untyped-def]
    model = ModelEndpointFactory(name=f"rules-{uuid.uuid4().hex[:6]}", api="rules", options={})
    agent = AgentFactory(
        slug=f"ask-{uuid.uuid4().hex[:8]}", model=model, tools=["ask_user"], rules=RULES
    )
    made: Session = SessionFactory(agent=agent, owner=UserFactory())
    return made


def _run(session: Session) -> Session:
    result = session_run(session_id=session.pk)
    assert result.stopped == "idle", result
    return Session.objects.get(pk=session.pk)


def _asked(session: Session) -> Session:
    message_post(session=session, content="ship it")
    session = _run(session)
    assert (session.state, session.lease_owner) == ("paused_for_user", None)
    return session


def test_the_users_next_message_answers_and_the_same_turn_goes_on(session):
    session = _asked(session)
    turn = session.turn
    question = Event.objects.filter(session=session, type="progress").latest("seq").data
    assert question["stage"] == "question" and question["question"] == "Which speed?"
    assert question["options"] == ["fast", "slow"] and question["deadline"]
    call = ToolCall.objects.get(session=session)
    assert call.status == "executing"

    posted = message_post(session=session, content="fast")
    assert posted.message.role == "tool" and posted.message.tool_call_id == call.call_id
    session = Session.objects.get(pk=session.pk)
    assert (session.state, session.turn, session.timer_due_at) == ("tool_loop", turn, None)
    session = _run(session)

    assert session.state == "finished" and session.turn == turn
    answer = Message.objects.filter(session=session, role="assistant").latest("seq")
    assert answer.content == "Shipping fast"
    call.refresh_from_db()
    assert (call.status, call.output) == ("success", {"answer": "fast", "by": "user"})
    triggers = list(
        Transition.objects.filter(session=session).order_by("id").values_list("trigger", flat=True)
    )
    assert triggers == [
        "user_message", "tool_calls", "ask_user", "user_answer", "model_call", "answer"
    ]  # fmt: skip


def test_the_deadline_answers_with_the_default(session):
    session = _asked(session)
    assert questions_expire_due() == []  # not due yet
    Session.objects.filter(pk=session.pk).update(timer_due_at=timezone.now() - timedelta(seconds=1))

    assert questions_expire_due() == [str(session.pk)]
    assert questions_expire_due() == []  # answered once
    session = _run(Session.objects.get(pk=session.pk))

    assert Message.objects.filter(session=session, role="assistant").latest("seq").content == (
        "Shipping slow"
    )
    call = ToolCall.objects.get(session=session)
    assert call.output == {"answer": "slow", "by": "system"}


def test_a_cancelled_question_is_closed_and_the_next_message_starts_a_new_turn(session):
    session = _asked(session)
    assert session_cancel(session=session, reason="never mind")
    session = Session.objects.get(pk=session.pk)
    assert session.state == "cancelled"
    assert ToolCall.objects.get(session=session).status != "executing"

    message_post(session=session, content="hello")
    assert Session.objects.get(pk=session.pk).turn == session.turn + 1


def test_a_message_queued_while_the_turn_ran_answers_the_question_it_then_asked(session):
    message_post(session=session, content="ship it")
    queued = message_post(session=session, content="fast")  # the turn is running: queued
    assert queued.message.status == "queued"

    session = _run(session)

    assert (session.state, session.turn, session.queued_count) == ("finished", 1, 0)
    assert Message.objects.filter(session=session, role="assistant").latest("seq").content == (
        "Shipping fast"
    )
    assert not Message.objects.filter(session=session, status="queued").exists()
    call = ToolCall.objects.get(session=session)
    assert (call.status, call.output) == ("success", {"answer": "fast", "by": "user"})
