"""Each operator control of a session takes its own permission, and what was said takes
`view_message_content`: a staff user of the session's tenant with "view session" alone
sees the page and changes nothing."""

import uuid
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from engine import session_run
from record.models import Checkpoint, Message, Session, ToolCall
from runtime.breaker import model_breaker
from sessions.services import message_post
from tests.factories import StaffUserFactory, ToolFactory, permissions

# The engine runs tools on helper threads with their own connections: they must see commits.
pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "SECRET-4711"
RULES = [
    {"when": {"user": "^wait", "last_tool": None},
     "tool_calls": [{"tool": "ask_user", "args": {"question": "Sure?"}}]},
    {"when": {"last_tool": "lookup"}, "answer": "It is {{ result.now }}"},
    {"answer": "Noted: {{ user }}"},
]  # fmt: skip
VIEW = ["agent_sessions.view_session"]


@pytest.fixture(autouse=True)
def _no_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("record.dispatch.run_enqueue_on_commit", lambda *args: None)


@pytest.fixture
def staff():  # type: ignore[no-untyped-def]
    return StaffUserFactory(username="tenant", perms=VIEW)


@pytest.fixture
def make_run(make_agent, staff):  # type: ignore[no-untyped-def]
    ToolFactory(name="lookup", handler="builtin.current_time")
    agent = make_agent(slug=f"op-{uuid.uuid4().hex[:6]}", tools=["ask_user", "lookup"], rules=RULES)

    def run(content: str) -> Session:
        session = Session.objects.create(agent=agent, owner=staff, role="support")
        message_post(session=session, content=content)
        session_run(session_id=session.pk)
        return Session.objects.get(pk=session.pk)

    return run


def _client(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _operate(client: Client, session: Session, **data: str) -> int:
    url = reverse("admin:agent_sessions_session_operate", args=[session.pk])
    return int(client.post(url, data).status_code)


def _page(client: Client, session: Session) -> str:
    response = client.get(reverse("admin:agent_sessions_session_change", args=[session.pk]))
    return str(response.content.decode())


@pytest.mark.parametrize(
    ("permission", "state", "action", "data", "granted"),
    [
        ("change_session", "error", "resume", {}, lambda s: s.state == "tool_loop"),
        ("take_over_session", "paused_for_user", "force_finish", {"content": "Done."},
         lambda s: s.state == "finished"),
        ("take_over_session", "finished", "reply", {"content": "Operator here."},
         lambda s: Message.objects.filter(session=s, content="Operator here.").exists()),
        ("take_over_session", "finished", "hand_back", {}, lambda s: s.state == "tool_loop"),
        ("run_tool_session", "finished", "run_tool",
         {"tool": "lookup", "arguments": "{}", "confirm": "yes"},
         lambda s: ToolCall.objects.filter(session=s, tool_name="lookup").exists()),
        ("fork_session", "finished", "fork", {"confirm": "yes"},
         lambda s: Session.objects.filter(forked_from=s).exists()),
    ],
)  # fmt: skip
def test_each_control_takes_its_own_permission(
    staff, make_run, permission: str, state: str, action: str, data: dict[str, str], granted: Any
) -> None:
    session = make_run("wait" if state == "paused_for_user" else "hi")
    if state == "error":
        Session.objects.filter(pk=session.pk).update(state="error", last_error="boom")
    assert Session.objects.get(pk=session.pk).state == state
    client = _client(staff)
    assert f'value="{action}"' not in _page(client, session)
    assert _operate(client, session, action=action, **data) == 403
    # Another control's permission does not open this one.
    others = {"change_session", "take_over_session", "run_tool_session", "fork_session"}
    staff.user_permissions.add(
        *permissions(*(f"agent_sessions.{p}" for p in others - {permission}))
    )
    assert _operate(client, session, action=action, **data) == 403
    assert not granted(Session.objects.get(pk=session.pk))

    staff.user_permissions.set(permissions(*VIEW, f"agent_sessions.{permission}"))
    assert f'value="{action}"' in _page(client, session)
    assert _operate(client, session, action=action, **data) == 302
    assert granted(Session.objects.get(pk=session.pk))


def test_cancel_takes_the_operate_permission(staff, make_run) -> None:
    session = make_run("wait")
    client = _client(staff)
    cancel = reverse("admin:agent_sessions_session_cancel", args=[session.pk])
    changelist = reverse("admin:agent_sessions_session_changelist")
    action = {"action": "cancel_running_turn", "_selected_action": [session.pk], "index": 0}
    assert client.post(cancel).status_code == 403
    client.post(changelist, action)
    assert not Session.objects.get(pk=session.pk).cancel_requested

    staff.user_permissions.add(*permissions("agent_sessions.change_session"))
    client.post(changelist, action)
    session = Session.objects.get(pk=session.pk)
    assert session.state == "cancelled" or session.cancel_requested


def test_forking_from_a_checkpoint_takes_the_fork_permission(staff, make_run) -> None:
    session = make_run("hi")
    checkpoint = Checkpoint.objects.filter(session=session).order_by("-step").first()
    staff.user_permissions.add(*permissions("agent_sessions.view_checkpoint"))
    client = _client(staff)
    url = reverse("admin:agent_sessions_checkpoint_changelist")
    fork = {"action": "fork_from_checkpoint", "_selected_action": [checkpoint.pk], "index": 0}
    assert "fork_from_checkpoint" not in client.get(url).content.decode()
    client.post(url, fork)
    assert not Session.objects.filter(forked_from=session).exists()

    staff.user_permissions.add(*permissions("agent_sessions.fork_session"))
    preview = client.post(url, fork)
    # The action shows the fork's preview; only its confirmation forks.
    assert preview.status_code == 200 and "fork-preview" in preview.content.decode()
    assert not Session.objects.filter(forked_from=session).exists()
    confirm = {"action": f"fork@{checkpoint.step}", "confirm": "yes"}
    assert _operate(client, session, **confirm) == 302
    assert Session.objects.filter(forked_from=session).exists()


@pytest.mark.parametrize(
    ("permission", "action", "data", "page"),
    [
        ("run_tool_session", "run_tool", {"tool": "lookup", "arguments": "{}"}, "tool-preview"),
        ("fork_session", "fork", {}, "fork-preview"),
    ],
)
def test_a_fork_and_a_hand_run_show_a_preview_before_they_act(
    staff, make_run, permission: str, action: str, data: dict[str, str], page: str
) -> None:
    session = make_run("hi")
    staff.user_permissions.add(*permissions(f"agent_sessions.{permission}"))
    client = _client(staff)
    url = reverse("admin:agent_sessions_session_operate", args=[session.pk])
    response = client.post(url, {"action": action, **data})
    assert response.status_code == 200 and page in response.content.decode()
    assert not Session.objects.filter(forked_from=session).exists()
    assert not ToolCall.objects.filter(session=session, tool_name="lookup").exists()
    assert Session.objects.get(pk=session.pk).state == "finished"


def test_what_was_said_takes_the_message_content_permission(staff, make_run) -> None:
    session = make_run(f"hello {SECRET}")
    staff.user_permissions.add(
        *permissions(
            "agent_sessions.view_message", "agent_sessions.view_toolcall",
            "agent_sessions.view_event", "agent_sessions.view_checkpoint",
        )
    )  # fmt: skip
    client = _client(staff)
    message = Message.objects.filter(session=session, role="user").get()
    pages = [
        reverse("admin:agent_sessions_session_change", args=[session.pk]),
        reverse("admin:agent_sessions_message_changelist"),
        reverse("admin:agent_sessions_message_change", args=[message.pk]),
        reverse("admin:agent_sessions_event_changelist"),
        reverse("admin:agent_sessions_checkpoint_changelist"),
    ]
    for page in pages:
        response = client.get(page)
        assert response.status_code == 200 and SECRET not in response.content.decode(), page
    search = client.get(pages[1], {"q": SECRET})
    link = reverse("admin:agent_sessions_message_change", args=[message.pk])
    assert link not in search.content.decode()

    staff.user_permissions.add(*permissions("agent_sessions.view_message_content"))
    for page in pages[:4]:
        assert SECRET in client.get(page).content.decode(), page
    search = client.get(pages[1], {"q": SECRET})
    assert link in search.content.decode()


def test_resetting_a_breaker_takes_its_permission(rules_model) -> None:
    staff = StaffUserFactory(username="ops", perms=["agent_sessions.view_modelendpoint"])
    breaker = model_breaker()
    for _ in range(breaker.threshold):
        breaker.record_failure(rules_model.name)
    client = _client(staff)
    url = reverse("admin:agent_sessions_modelendpoint_changelist")
    reset = {"action": "reset_breaker", "_selected_action": [rules_model.pk], "index": 0}
    try:
        assert "reset_breaker" not in client.get(url).content.decode()
        client.post(url, reset)
        assert breaker.state(rules_model.name).state == "open"

        staff.user_permissions.add(*permissions("agent_sessions.reset_breaker_modelendpoint"))
        client.post(url, reset)
        assert breaker.state(rules_model.name).state == "closed"
    finally:
        breaker.reset(rules_model.name)
