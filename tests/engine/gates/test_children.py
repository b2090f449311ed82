"""Agents together, in process: another agent as a tool (a child session per call, several in
parallel, the parent holding no worker), and a handoff of the conversation to another agent.

`transaction=True`: tools run on helper threads with their own database connections.
"""

import json
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from engine import session_run
from engine.phases.model import model_plan
from engine.run_cache import RunContext
from engine.runner import loop
from record.models import Agent, Event, Message, ModelEndpoint, Session, ToolCall, Transition
from sessions.admin.display import HIDDEN, event_summary
from sessions.services import agent_version_record, message_post, session_cancel
from tests.factories import (
    AgentFactory,
    ModelEndpointFactory,
    SessionFactory,
    ToolFactory,
    UserFactory,
    api_key_for,
)
from tests.fakes.fixtures import fake_servers  # noqa: F401
from tests.fakes.model_servers import Call, FakeServers, Reply

pytestmark = pytest.mark.django_db(transaction=True)

BOSS_RULES: list[dict[str, Any]] = [
    {"when": {"user": "ask both about (\\w+)", "last_tool": None},
     "tool_calls": [{"tool": "agent.researcher", "args": {"task": "research {{ match.1 }}"}},
                    {"tool": "agent.writer", "args": {"task": "write about {{ match.1 }}"}}]},
    {"when": {"user": "ask the researcher about (\\w+)", "last_tool": None},
     "tool_calls": [{"tool": "agent.researcher", "args": {"task": "research {{ match.1 }}"}}]},
    {"when": {"user": "bill me", "last_tool": None},
     "tool_calls": [{"tool": "transfer_to_billing", "args": {"reason": "a billing question"}}]},
    {"when": {"user": "go to vault", "last_tool": None},
     "tool_calls": [{"tool": "transfer_to_vault", "args": {"reason": "secrets"}}]},
    {"when": {"last_tool": "transfer_to_vault"}, "answer": "Stayed: {{ result.error }}"},
    {"when": {"last_tool": "agent.writer"},
     "answer": "Both: {{ results.0.answer }} / {{ results.1.answer }}"},
    {"when": {"last_tool": "agent.researcher", "result": '"status":"failed"'},
     "answer": "The researcher failed: {{ result.error }}"},
    {"when": {"last_tool": "agent.researcher"}, "answer": "Researcher said: {{ result.answer }}"},
    {"answer": "boss here"},
]  # fmt: skip


@pytest.fixture
def boss() -> Session:
    model = ModelEndpointFactory(name="rules", api="rules", options={})
    AgentFactory(slug="researcher", model=model, rules=[{"answer": "found: {{ user }}"}])
    AgentFactory(slug="writer", model=model, rules=[{"answer": "wrote: {{ user }}"}])
    AgentFactory(slug="billing", model=model, rules=[{"answer": "billing speaking ({{ user }})"}])
    ToolFactory(name="vault_open", roles=["admin"])
    AgentFactory(slug="vault", model=model, tools=["vault_open"], rules=[{"answer": "vault"}])
    agent = AgentFactory(
        slug="boss",
        model=model,
        tools=["agent.researcher", "agent.writer"],
        handoffs=["billing", "vault"],
        rules=BOSS_RULES,
    )
    return SessionFactory(agent=agent, role="support")


def _run(session: Session, stopped: str = "idle") -> Session:
    result = session_run(session_id=session.pk)
    assert result.stopped == stopped, result
    return Session.objects.get(pk=session.pk)


def _answer(session: Session) -> str:
    return Message.objects.filter(session=session, role="assistant").latest("seq").content


def test_another_agent_answers_as_a_tool_in_a_child_session(boss: Session) -> None:
    message_post(session=boss, content="ask the researcher about parcels")
    parent = _run(boss, stopped="waiting")

    assert parent.state == "tool_wait" and parent.lease_owner is None
    child = Session.objects.get(parent=parent)
    assert (child.agent.slug, child.role, child.owner_id) == (
        "researcher",
        "support",
        boss.owner_id,
    )
    started = Event.objects.get(session=parent, type="child.started").data
    assert started == {
        "call_id": child.parent_call.call_id, "session": str(child.pk), "agent": "researcher"
    }  # fmt: skip
    Session.objects.filter(pk=child.pk).update(cost=Decimal("0.5"))
    # The call opened a minute ago: its duration is the child's run, not its result's read.
    ToolCall.objects.filter(pk=child.parent_call_id).update(
        created_at=timezone.now() - timedelta(seconds=60)
    )

    assert _run(child).state == "finished"
    parent = _run(parent)
    assert ToolCall.objects.get(pk=child.parent_call_id).elapsed_ms >= 60_000

    assert parent.state == "finished"
    assert _answer(parent) == "Researcher said: found: research parcels"
    finished = Event.objects.get(session=parent, type="child.finished").data
    assert finished["state"] == "finished" and finished["session"] == str(child.pk)
    assert parent.cost == Decimal("0.5")  # the child's usage counts in the parent's


def test_several_agent_calls_in_one_step_run_in_parallel(boss: Session) -> None:
    message_post(session=boss, content="ask both about tides")
    parent = _run(boss, stopped="waiting")

    children = list(Session.objects.filter(parent=parent).order_by("created_at"))
    assert [c.agent.slug for c in children] == ["researcher", "writer"]
    assert all(c.state == "processing" for c in children)  # both started before either ran
    _run(children[1])
    assert _run(parent, stopped="waiting").state == "tool_wait"  # one still runs
    _run(children[0])
    parent = _run(parent)

    assert _answer(parent) == "Both: found: research tides / wrote: write about tides"


def test_a_child_that_ends_while_its_parent_still_holds_the_lease_wakes_it_all_the_same(
    boss: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last child ends between its parent's look at the children and the parent giving its
    lease back: that child's wake-up finds the lease held (not_acquired) and is gone. The parent
    looks again once the lease is given back and wakes itself; it used to wait for the
    sweeper, CHILDREN_RECHECK_S (300 s) later."""
    woken: list[str] = []
    monkeypatch.setattr("record.dispatch._submit", lambda session_id, *_: woken.append(session_id))
    monkeypatch.setattr("record.dispatch.task_send", lambda _name, args, **_: woken.append(args[0]))
    message_post(session=boss, content="ask both about tides")
    parent = _run(boss, stopped="waiting")
    researcher = Session.objects.get(parent=parent, agent__slug="researcher")
    _run(Session.objects.get(parent=parent, agent__slug="writer"))
    lost: list[str] = []
    real_drop = loop.lease_drop

    def drop_late(**kwargs: Any) -> None:
        if not lost:
            _run(researcher)  # ends now, after the parent's gate saw it running
            lost.append(session_run(session_id=parent.pk).stopped)  # its wake-up
            woken.clear()
        real_drop(**kwargs)

    monkeypatch.setattr(loop, "lease_drop", drop_late)
    assert session_run(session_id=parent.pk).stopped == "waiting"  # the writer's wake-up

    assert lost == ["not_acquired"]
    assert woken == [str(parent.pk)]  # woken again, by itself
    parent = _run(parent)
    assert _answer(parent) == "Both: found: research tides / wrote: write about tides"


class _Killed(BaseException):
    """The worker dies here (SIGKILL): nothing after it runs, no handler sees it."""


def test_children_started_just_before_a_crash_are_announced_by_the_next_run(
    boss: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A crash after the children's start and before the parent's `child.started` commit:
    the next run starts no child again and puts each missing `child.started` on the parent's
    stream, before any `child.finished`. It used to leave them out for good."""

    def killed(*_: Any) -> None:
        raise _Killed

    monkeypatch.setattr("engine.phases.tools.children_started", killed)
    message_post(session=boss, content="ask both about tides")
    with pytest.raises(_Killed):
        session_run(session_id=boss.pk)
    monkeypatch.undo()
    researcher, writer = Session.objects.filter(parent=boss).order_by("created_at")
    assert not Event.objects.filter(session=boss, type="child.started").exists()
    _run(writer)  # one ends before anyone looks again
    Session.objects.filter(pk=boss.pk).update(lease_expires_at=timezone.now())  # ran out

    parent = _run(boss, stopped="waiting")
    _run(researcher)
    parent = _run(parent)

    assert Session.objects.filter(parent=boss).count() == 2
    assert _answer(parent) == "Both: found: research tides / wrote: write about tides"
    children = Event.objects.filter(session=boss, type__startswith="child.").order_by("seq")
    assert [(e.type, e.data["session"]) for e in children] == [
        ("child.started", str(researcher.pk)),
        ("child.started", str(writer.pk)),
        ("child.finished", str(researcher.pk)),
        ("child.finished", str(writer.pk)),
    ]


def test_a_child_that_fails_is_a_tool_error_the_parent_can_act_on(boss: Session) -> None:
    message_post(session=boss, content="ask the researcher about x")
    parent = _run(boss, stopped="waiting")
    child = Session.objects.get(parent=parent)
    session_cancel(session=child, reason="operator stopped it", actor="op")
    _run(child)

    parent = _run(parent)

    assert parent.state == "finished"
    assert "ended cancelled: operator stopped it" in _answer(parent)
    call = ToolCall.objects.get(session=parent, tool_name="agent.researcher")
    assert call.status == "failed"


def test_a_handoff_switches_the_agent_with_the_history_kept(boss: Session) -> None:
    billing_version = agent_version_record(
        agent=Agent.objects.get(slug="billing"), actor="t", source="config"
    )
    boss_version = agent_version_record(agent=boss.agent, actor="t", source="config")
    message_post(session=boss, content="hello")
    boss = _run(boss)
    assert boss.agent_version == boss_version  # stamped by the turn's first step
    message_post(session=boss, content="bill me")
    session = _run(boss)
    # The handoff's step stamps the version of the agent handed to.
    assert session.agent_version == billing_version is not None

    assert session.agent.slug == "billing"
    assert _answer(session) == "billing speaking (bill me)"
    changed = Event.objects.get(session=session, type="agent.changed").data
    assert changed == {"from": "boss", "to": "billing", "reason": "a billing question"}
    assert Transition.objects.filter(session=session, trigger="handoff").count() == 1
    assert Message.objects.filter(session=session, role="user").count() == 2  # history kept


def _offered(session: Session) -> list[str]:
    """The tool names the session's next model call is offered."""
    return [t.name for t in model_plan(session, RunContext()).request.tools]


def test_a_handoff_is_offered_only_to_a_role_that_may_use_the_agents_tools(
    boss: Session,
) -> None:
    admin = SessionFactory(agent=boss.agent, role="admin", owner=boss.owner)
    message_post(session=boss, content="hello")
    message_post(session=admin, content="hello")

    assert _offered(boss) == ["agent.researcher", "agent.writer", "transfer_to_billing"]
    assert "transfer_to_vault" in _offered(admin)


def test_a_triage_agent_with_only_handoffs_is_offered_them_and_hands_over() -> None:
    model = ModelEndpointFactory(name="rules", api="rules", options={})
    AgentFactory(slug="billing", model=model, rules=[{"answer": "billing speaking"}])
    triage = AgentFactory(
        slug="triage",
        model=model,
        tools=[],
        handoffs=["billing"],
        rules=[{"when": {"user": "invoice"},
                "tool_calls": [{"tool": "transfer_to_billing", "args": {"reason": "invoices"}}]}],
    )  # fmt: skip
    session = SessionFactory(agent=triage, role="support")
    message_post(session=session, content="about my invoice")

    assert _offered(session) == ["transfer_to_billing"]
    session = _run(session)
    assert session.agent.slug == "billing"
    assert _answer(session) == "billing speaking"


@pytest.mark.parametrize("api", ["openai", "anthropic", "prompt_tools"])
@pytest.mark.parametrize("own_tools", [[], ["agent.researcher"]])
def test_the_transfer_is_offered_over_every_wire_and_a_real_model_hands_over(
    boss: Session,
    fake_servers: FakeServers,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    api: str,
    own_tools: list[str],
) -> None:
    server = fake_servers.anthropic if api == "anthropic" else fake_servers.openai
    server.reset()
    monkeypatch.setenv("HANDOFF_TEST_KEY", "sk-handoff-test")
    endpoint = ModelEndpointFactory(
        name=f"fake-{api}-{len(own_tools)}",
        api=api,
        base_url=server.base_url,
        model="fake-model",
        api_key_env="HANDOFF_TEST_KEY",
    )
    triage = AgentFactory(slug="triage", model=endpoint, tools=own_tools, handoffs=["billing"])
    transfer = {"reason": "a billing question"}
    server.script(
        Reply(
            text=json.dumps(
                {"tool_calls": [{"name": "transfer_to_billing", "arguments": transfer}]}
            )
        )
        if api == "prompt_tools"
        else Reply(calls=[Call("transfer_to_billing", transfer)])
    )
    session = SessionFactory(agent=triage, role="support", owner=boss.owner)
    message_post(session=session, content="about my bill")
    session = _run(session)

    (sent,) = server.requests
    if api == "prompt_tools":
        assert "- transfer_to_billing: Hand this conversation over" in sent.text()
    else:
        offered = [t.get("name") or t["function"]["name"] for t in sent.body["tools"]]
        assert "transfer_to_billing" in offered
    assert session.agent.slug == "billing"
    assert _answer(session) == "billing speaking (about my bill)"
    assert not server.violations and not server.invalid


def test_a_handoff_the_model_was_not_offered_is_refused(boss: Session) -> None:
    # A model that calls what it was not offered (the strict rules model never does).
    ModelEndpoint.objects.filter(name="rules").update(options={"strict": False})
    message_post(session=boss, content="go to vault")
    session = _run(boss)

    assert session.agent.slug == "boss"
    assert "may not use its tools vault_open" in _answer(session)
    assert not Event.objects.filter(session=session, type="agent.changed").exists()
    # The refused handoff counts as failed, as its tool.finished says.
    finished = Event.objects.filter(session=session, type="turn.finished").latest("seq").data
    assert finished["calls"] == {"ok": 0, "failed": 1, "rejected": 0, "expired": 0, "unpaid": 0}
    assert finished["outcome"] == "tool_failures"

    Agent.objects.filter(slug="boss").update(handoffs=["billing"])
    message_post(session=session, content="go to vault")
    session = _run(session)
    assert session.agent.slug == "boss"
    assert "no agent 'vault' to hand over to" in _answer(session)


def test_the_api_and_the_admin_show_the_tree(boss: Session) -> None:
    message_post(session=boss, content="ask the researcher about parcels")
    parent = _run(boss, stopped="waiting")
    child = Session.objects.get(parent=parent)
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {api_key_for(boss.owner.username)}")

    body = api.get(f"/api/v1/sessions/{parent.pk}/").json()
    assert (body["parent"], body["children"]) == (None, [str(child.pk)])
    assert api.get(f"/api/v1/sessions/{child.pk}/").json()["parent"] == str(parent.pk)

    admin = Client()
    admin.force_login(UserFactory(username="root", is_staff=True, is_superuser=True))
    page = admin.get(f"/admin/agent_sessions/session/{parent.pk}/change/").content.decode()
    assert f"/admin/agent_sessions/session/{child.pk}/change/" in page and "researcher" in page


def test_the_timeline_says_which_child_and_which_agent_in_a_line() -> None:
    child = {"call_id": "call_1", "session": "4da53ebf-a8bd-4ad5", "agent": "researcher"}
    changed = {"from": "boss", "to": "billing", "reason": "a billing question"}

    assert event_summary("child.started", child) == (
        "researcher started · session 4da53ebf · call call_1"
    )
    assert event_summary("child.finished", {**child, "state": "error"}, content=False) == (
        "researcher error · session 4da53ebf · call call_1"
    )
    assert event_summary("agent.changed", changed) == "boss → billing: a billing question"
    assert event_summary("agent.changed", changed, content=False) == f"boss → billing: {HIDDEN}"


NINE = [{"tool": "agent.researcher", "args": {"task": f"part {i}"}} for i in range(9)]


def _fan_out_boss(boss: Session) -> Session:
    boss.agent.rules = [
        {"when": {"user": "fan out", "last_tool": None}, "tool_calls": NINE},
        *BOSS_RULES,
    ]
    boss.agent.save(update_fields=["rules"])
    message_post(session=boss, content="fan out")
    return _run(boss, stopped="waiting")


def _finish(parent: Session) -> Session:
    for child in Session.objects.filter(parent=parent, state="processing"):
        _run(child)
    return _run(parent)


def test_one_step_starts_at_most_8_agent_calls_and_the_rest_get_a_tool_error(
    boss: Session,
) -> None:
    parent = _fan_out_boss(boss)

    started = Session.objects.filter(parent=parent).order_by("parent_call__position")
    assert [c.parent_call.input["task"] for c in started] == [f"part {i}" for i in range(8)]
    parent = _finish(parent)

    calls = list(ToolCall.objects.filter(session=parent).order_by("position"))
    assert [c.status for c in calls] == ["success"] * 8 + ["failed"]
    assert calls[8].error.startswith(
        "too_many_children: one step may start at most 8 agent calls and this one asked for 9"
    )
    assert _answer(parent).startswith("The researcher failed: too_many_children")


def test_a_run_tree_creates_at_most_50_sessions(boss: Session) -> None:
    # 45 sessions this turn already made (children and grandchildren count alike).
    turn = boss.turn + 1  # the turn `fan out` starts
    first = ToolCall.objects.create(
        session=boss, turn=turn, step=1, call_id="c-0", tool_name="agent.researcher",
        idempotency_key="k-0", status="success",
    )  # fmt: skip
    ended = {"state": "finished", "turn": 1}
    child = SessionFactory(agent=boss.agent, parent=boss, parent_call=first, **ended)
    for i in range(44):
        call = ToolCall.objects.create(
            session=child, turn=1, step=1, position=i, call_id=f"g-{i}",
            tool_name="agent.researcher", idempotency_key=f"g-{i}",
        )  # fmt: skip
        SessionFactory(agent=boss.agent, parent=child, parent_call=call, **ended)

    parent = _fan_out_boss(boss)

    assert Session.objects.filter(parent=parent).count() == 1 + 5  # 45 + 5 = 50
    parent = _finish(parent)
    calls = list(
        ToolCall.objects.filter(session=parent, turn=turn, step__gt=1).order_by("position")
    )
    assert [c.status for c in calls] == ["success"] * 5 + ["failed"] * 4
    assert all(
        c.error.startswith("too_many_sessions: this run may create at most 50 agent sessions "
                           "and has no room for this call")
        for c in calls[5:8]
    )  # fmt: skip
    assert calls[8].error.startswith("too_many_children")
