"""Over REST a key never exceeds its own grants: a turn, an answer to the model's question, a
resume or a fork needs the session's role (403 `role_not_held`), and a session value set by
the client stays within what the key was granted (403 `value_not_allowed`).

The user `alice` has two keys: one with the roles admin and support, one with support only.
A session opened with the admin key runs with the admin role (its model may call the
admin-only tool); the support key must not drive it."""

import uuid
from typing import Any

import pytest
from django.contrib.auth import get_user_model

from accounts.models import ApiKey
from accounts.services import api_key_create
from engine import session_run
from record.models import Session, ToolCall
from sessions.services import message_post
from tests.factories import AgentFactory, ModelEndpointFactory, SessionFactory, ToolFactory

from .conftest import Api, assert_error

pytestmark = pytest.mark.django_db

BASE = "/api/v1/sessions/"


@pytest.fixture
def admin_tool(api_agent):  # type: ignore[no-untyped-def]
    ToolFactory(name="wipe_orders", roles=["admin"])
    api_agent.tools = ["wipe_orders"]
    api_agent.save(update_fields=["tools"])
    return api_agent


@pytest.fixture
def admin_key(admin_tool) -> Api:  # type: ignore[no-untyped-def]
    return Api(api_key_create(username="alice", roles=["admin", "support"]).raw)


@pytest.fixture
def support_key(admin_tool) -> Api:  # type: ignore[no-untyped-def]
    return Api(api_key_create(username="alice", roles=["support"]).raw)


def _open(api: Api, **body: Any) -> dict[str, Any]:
    response = api.post(BASE, {"agent": "helper", **body})
    assert response.status_code == 201, response.content
    created: dict[str, Any] = response.json()
    return created


def _unchanged(session_id: str) -> tuple[Any, ...]:
    row = Session.objects.get(pk=session_id)
    return (row.state, row.version, row.turn, row.queued_count, row.messages.count())


def _assert_role_not_held(response: Any, role: str = "admin") -> None:
    error = assert_error(response, 403, "role_not_held")
    assert error["details"] == {"role": role, "key_roles": ["support"]}
    assert f"'{role}'" in error["message"]


# Messages ------------------------------------------------------------------------------


def test_a_key_without_the_sessions_role_cannot_post_a_turn(admin_key, support_key):
    session = _open(admin_key, role="admin")
    assert session["role"] == "admin"
    before = _unchanged(session["id"])

    refused = support_key.post(
        f"{BASE}{session['id']}/messages/", {"content": "wipe all orders", "idempotency_key": "k1"}
    )

    _assert_role_not_held(refused)
    assert _unchanged(session["id"]) == before  # nothing stored, no turn started
    # The key that holds the role still may; the refused idempotency key was never used.
    posted = admin_key.post(
        f"{BASE}{session['id']}/messages/", {"content": "wipe all orders", "idempotency_key": "k1"}
    )
    assert posted.status_code == 202, posted.content


@pytest.mark.parametrize(
    ("opener_roles", "role"),
    [
        ([], None),  # a key without roles opens a session with an empty role: any key's
        (["admin", "support"], "support"),  # the support key holds the session's role
    ],
)
def test_a_key_holding_the_role_or_a_session_without_one_takes_the_turn(
    admin_tool, support_key, opener_roles, role
):
    opener = Api(api_key_create(username="alice", roles=opener_roles).raw)
    session = _open(opener, **({"role": role} if role else {}))
    assert session["role"] == (role or "")
    posted = support_key.post(f"{BASE}{session['id']}/messages/", {"content": "hello"})
    assert posted.status_code == 202, posted.content


def test_the_roles_are_those_the_key_holds_at_the_request(admin_key, support_key):
    session = _open(admin_key, role="admin")
    ApiKey.objects.filter(owner__username="alice", roles__contains=["admin"]).update(
        roles=["support"]
    )
    _assert_role_not_held(admin_key.post(f"{BASE}{session['id']}/messages/", {"content": "hi"}))


RULES = [
    {"when": {"user": "^ship", "last_tool": None},
     "tool_calls": [{"tool": "ask_user", "args": {"question": "Which speed?"}}]},
    {"when": {"last_tool": "ask_user"}, "answer": "Shipping {{ result.answer }}"},
    {"answer": "?"},
]  # fmt: skip


@pytest.mark.django_db(transaction=True)
def test_the_answer_to_the_models_question_needs_the_role_too(admin_key, support_key, monkeypatch):
    monkeypatch.setattr("record.dispatch.run_enqueue_on_commit", lambda *args: None)
    model = ModelEndpointFactory(name=f"rules-{uuid.uuid4().hex[:6]}", api="rules", options={})
    agent = AgentFactory(slug="asker", model=model, tools=["ask_user"], rules=RULES)
    alice = get_user_model().objects.get(username="alice")
    session = SessionFactory(agent=agent, owner=alice, role="admin")
    message_post(session=session, content="ship it")
    assert session_run(session_id=session.pk).stopped == "idle"
    assert Session.objects.get(pk=session.pk).state == "paused_for_user"
    before = _unchanged(str(session.pk))

    refused = support_key.post(f"{BASE}{session.pk}/messages/", {"content": "fast"})

    _assert_role_not_held(refused)
    assert _unchanged(str(session.pk)) == before
    assert ToolCall.objects.get(session=session).status == "executing"  # still asked
    answered = admin_key.post(f"{BASE}{session.pk}/messages/", {"content": "fast"})
    assert answered.status_code == 202 and answered.json()["role"] == "tool"


# Resume --------------------------------------------------------------------------------


def test_a_key_without_the_sessions_role_cannot_resume_it(admin_key, support_key, api_agent):
    alice = get_user_model().objects.get(username="alice")
    session = SessionFactory(agent=api_agent, owner=alice, role="admin", state="error")

    _assert_role_not_held(support_key.post(f"{BASE}{session.pk}/resume/"))
    assert Session.objects.get(pk=session.pk).state == "error"
    resumed = admin_key.post(f"{BASE}{session.pk}/resume/")
    assert resumed.status_code == 200 and resumed.json()["state"] != "error", resumed.content


# Forks ---------------------------------------------------------------------------------


def _checkpoint(api: Api, session_id: str) -> int:
    assert api.post(f"{BASE}{session_id}/messages/", {"content": "hello"}).status_code == 202
    steps = [c["step"] for c in api.get(f"{BASE}{session_id}/checkpoints/").json()]
    assert steps
    return int(steps[0])


def test_a_fork_by_a_key_without_the_sessions_role_is_refused(admin_key, support_key):
    session = _open(admin_key, role="admin")
    step = _checkpoint(admin_key, session["id"])
    sessions_before = Session.objects.count()

    _assert_role_not_held(support_key.post(f"{BASE}{session['id']}/fork/", {"checkpoint": step}))
    # Naming a role the key lacks is refused the same way.
    _assert_role_not_held(
        support_key.post(f"{BASE}{session['id']}/fork/", {"checkpoint": step, "role": "admin"})
    )
    assert Session.objects.count() == sessions_before


def test_a_fork_may_name_a_role_the_key_holds(admin_key, support_key):
    session = _open(admin_key, role="admin")
    step = _checkpoint(admin_key, session["id"])

    fork = support_key.post(f"{BASE}{session['id']}/fork/", {"checkpoint": step, "role": "support"})

    assert fork.status_code == 201, fork.content
    assert fork.json()["role"] == "support"
    assert Session.objects.get(pk=fork.json()["id"]).forked_from_id == uuid.UUID(session["id"])
    # The key that holds the session's role forks with it, as before.
    same = admin_key.post(f"{BASE}{session['id']}/fork/", {"checkpoint": step})
    assert same.status_code == 201 and same.json()["role"] == "admin", same.content


# Value ---------------------------------------------------------------------------------


def test_a_client_may_not_raise_its_sessions_value_above_the_agents_without_a_grant(
    support_key,
):
    refused = support_key.post(BASE, {"agent": "helper", "value": 16})

    error = assert_error(refused, 403, "value_not_allowed")
    assert error["details"] == {"field": "value", "max_value": 1.0}
    assert not Session.objects.exists()
    # Up to the agent's own value (the default) is anyone's.
    assert _open(support_key, value=1.0)["value"] == 1.0
    assert _open(support_key, value=0.25)["value"] == 0.25
    assert _open(support_key)["value"] == 1.0


def test_a_key_may_set_a_value_up_to_its_grant(admin_tool):
    granted = Api(api_key_create(username="alice", roles=["support"], max_value=20).raw)

    assert _open(granted, value=16)["value"] == 16
    error = assert_error(granted.post(BASE, {"agent": "helper", "value": 20.5}), 403)
    assert (error["code"], error["details"]["max_value"]) == ("value_not_allowed", 20)
    assert Session.objects.filter(value__gt=20).count() == 0


def test_an_agents_own_value_is_the_ceiling_without_a_grant(support_key, api_agent):
    api_agent.value = 3.0
    api_agent.save(update_fields=["value"])
    small = Api(api_key_create(username="alice", roles=["support"], max_value=2).raw)

    assert _open(support_key, value=3)["value"] == 3
    assert _open(small, value=3)["value"] == 3  # a grant never lowers the agent's own value
    error = assert_error(support_key.post(BASE, {"agent": "helper", "value": 3.5}), 403)
    assert (error["code"], error["details"]["max_value"]) == ("value_not_allowed", 3.0)
