"""The session page's operator controls (force-finish, takeover, hand back, fork) and approvals inline."""

import uuid
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.urls import reverse
from django.utils import timezone

from approvals.models import Approval
from engine import session_run
from record.models import Message, Session, ToolCall
from sessions.services import message_post
from tests.factories import ToolFactory

pytestmark = pytest.mark.django_db(transaction=True)

RULES = [
    {"when": {"user": "^wait", "last_tool": None},
     "tool_calls": [{"tool": "ask_user", "args": {"question": "Sure?"}}]},
    {"when": {"last_tool": "lookup"}, "answer": "It is {{ result.now }}"},
    {"answer": "Hello"},
]  # fmt: skip


@pytest.fixture(autouse=True)
def _no_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("record.dispatch.run_enqueue_on_commit", lambda *args: None)


@pytest.fixture
def operator(client):  # type: ignore[no-untyped-def]
    user = get_user_model().objects.create_superuser("op", "op@example.com", "pw-not-used")
    client.force_login(user)
    return user


@pytest.fixture
def session(make_session, make_agent) -> Session:  # type: ignore[no-untyped-def]
    ToolFactory(name="lookup", handler="builtin.current_time")
    agent = make_agent(slug=f"op-{uuid.uuid4().hex[:6]}", tools=["ask_user", "lookup"], rules=RULES)
    made: Session = make_session(agent=agent)
    return made


def _page(client, session: Session) -> str:
    response = client.get(reverse("admin:agent_sessions_session_change", args=[session.pk]))
    assert response.status_code == 200
    return str(response.content.decode())


def _operate(client, session: Session, **data: str):  # type: ignore[no-untyped-def]
    url = reverse("admin:agent_sessions_session_operate", args=[session.pk])
    return client.post(url, data, follow=True)


def test_force_finish_a_waiting_turn_from_the_session_page(client, operator, session):
    message_post(session=session, content="wait")
    session_run(session_id=session.pk)
    html = _page(client, session)
    assert "Force-finish this turn" in html and "Hand back" not in html

    page = _operate(client, session, action="force_finish", content="Done by hand.")
    assert "The turn ended with your answer." in page.content.decode()
    session.refresh_from_db()
    assert session.state == "finished"
    last = Message.objects.filter(session=session).latest("seq")
    assert (last.content, last.data["by"]) == ("Done by hand.", "admin:op")


def test_takeover_from_the_session_page_then_hand_back(client, operator, session):
    message_post(session=session, content="hi")
    session_run(session_id=session.pk)
    html = _page(client, session)
    assert "Take over: reply to the user" in html and "lookup" in html

    _operate(client, session, action="reply", content="Operator speaking.")
    preview = _operate(client, session, action="run_tool", tool="lookup", arguments="{}")
    html = preview.content.decode()
    assert "tool-preview" in html and "read-only" in html and "none needed" in html
    assert not ToolCall.objects.filter(session=session).exists()
    page = _operate(
        client, session, action="run_tool", tool="lookup", arguments="{}", confirm="yes"
    )
    assert "Lookup runs by hand on a worker" in page.content.decode()
    session_run(session_id=session.pk)
    assert ToolCall.objects.get(session=session).status == "success"
    bad = _operate(client, session, action="run_tool", tool="lookup", arguments="{nope")
    assert "not valid JSON" in bad.content.decode()
    refused = _operate(client, session, action="run_tool", tool="missing", arguments="{}")
    assert "not available" in refused.content.decode()
    refused = _operate(
        client, session, action="run_tool", tool="missing", arguments="{}", confirm="yes"
    )
    assert "not available" in refused.content.decode()
    assert ToolCall.objects.filter(session=session).count() == 1

    _operate(client, session, action="hand_back")
    session.refresh_from_db()
    assert session.state == "tool_loop"
    session_run(session_id=session.pk)
    answer = Message.objects.filter(session=session, role="assistant").latest("seq")
    assert answer.content.startswith("It is ")

    preview = _operate(client, session, action="fork")
    assert "fork-preview" in preview.content.decode()
    assert not Session.objects.filter(forked_from=session).exists()
    page = _operate(client, session, action="fork", confirm="yes")
    fork = Session.objects.get(forked_from=session)
    assert page.redirect_chain[-1][0].endswith(f"/{fork.pk}/change/")


def test_approvals_show_inline_in_the_timeline(client, operator, session):
    message_post(session=session, content="hi")
    session_run(session_id=session.pk)
    now = timezone.now()
    Approval.objects.create(
        session=session, tool_name="refund", arguments={"amount": 80}, risk_level=3,
        reason="risk level 3", deadline=now + timedelta(minutes=5), status="rejected",
        decided_at=now, decided_by_name="alice", comment="not today",
    )  # fmt: skip
    html = _page(client, session)
    assert "approval refund" in html and "risk 3" in html
    assert 'refund rejected by alice: "not today"' in html.replace("&quot;", '"')
    assert 'data-kind="approval"' in html


def test_a_decision_names_who_once_in_the_timeline():
    from sessions.admin.timeline import _summary
    from sessions.selectors import TimelineEntry

    def move(reason: str, actor: str) -> str:
        row = {"from_state": "awaiting_approval", "to_state": "tool_wait", "trigger": "approved",
               "reason": reason, "actor": actor}  # fmt: skip
        entry = TimelineEntry("transition", 1, timezone.now(), 1, None, "tool_wait", row)
        return _summary(entry, content=True)

    assert move("refund: approved by alice", "alice").endswith(": refund: approved by alice")
    assert "by alice by alice" not in move("refund: approved by alice", "alice")
    assert move("resumed", "admin:op").endswith("(approved): resumed by admin:op")
