"""The demo's agents together, offline with the strict rules model (as `make run` loads them):
a triage agent that hands order questions over to order support, and asks a sub-agent (an
agent used as a tool) about the refund policy."""

import pytest

from engine import session_run
from record.models import Message, Session, ToolCall
from sessions.services import message_post
from tests.demo_setup import DEMO_REQUEST, demo_install
from tests.factories import SessionFactory

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _no_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("record.dispatch.run_enqueue_on_commit", lambda *args: None)


def _answer(session: Session) -> str:
    return Message.objects.filter(session=session, role="assistant").latest("seq").content


def _triage() -> Session:
    demo_install()
    return SessionFactory(agent__slug="triage", role="support")


def test_the_triage_agent_hands_an_order_question_over_to_order_support() -> None:
    session = _triage()
    message_post(session=session, content=DEMO_REQUEST)
    session_run(session_id=session.pk)

    session = Session.objects.get(pk=session.pk)
    assert session.agent.slug == "order-support" and session.state == "finished"
    assert _answer(session).startswith("Done. I found")
    assert session.last_turn_outcome == "ok"


def test_the_triage_agent_asks_its_sub_agent_about_the_policy() -> None:
    session = _triage()
    message_post(session=session, content="What is your refund policy?")
    assert session_run(session_id=session.pk).stopped == "waiting"  # for the child
    child = Session.objects.get(parent=session)
    assert child.agent.slug == "refund-policy"
    session_run(session_id=child.pk)
    session_run(session_id=session.pk)

    session = Session.objects.get(pk=session.pk)
    assert session.state == "finished" and session.agent.slug == "triage"
    assert _answer(session).startswith("Our refund policy expert says: Refunds up to 52.00")
    call = ToolCall.objects.get(session=session, tool_name="agent.refund-policy")
    assert call.status == "success" and call.elapsed_ms is not None


def test_anything_else_gets_the_front_desks_hello() -> None:
    session = _triage()
    message_post(session=session, content="hi there")
    session_run(session_id=session.pk)
    assert _answer(Session.objects.get(pk=session.pk)).startswith("Hello, this is the front desk")
