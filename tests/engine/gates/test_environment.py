"""Context drift on the real engine (runtime-mechanisms 4.3): after a long pause (or a
crash recovery), the model is told what changed when it changed enough, and side effects
decided before such a change are not sent before the model has seen it.

The model is the fake OpenAI server (tests/fakes), so each test reads the request the
model received. A pause is made by moving the history's times back.
"""

import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.db.models import F
from django.utils import timezone

from engine import session_run
from engine.phases.model import model_step
from engine.runner.lease import lease_acquire
from record.models import Agent, Checkpoint, Message, ModelEndpoint, Session, ToolCall
from sessions.services import message_post
from tests.factories import AgentFactory, SessionFactory, ToolFactory, UserFactory
from tests.fakes.fixtures import fake_servers, openai_server, unique  # noqa: F401
from tests.fakes.model_servers import Call, FakeModelServer, Reply
from tools.models import Tool
from tools.registry import tool_handler

pytestmark = pytest.mark.django_db(transaction=True)

KEY_ENV = "DRIFT_MODEL_KEY"
NOTE = "the situation changed"
CRASHED = "crashed-worker:1:1:dead"
DIALOGUE = {
    "intents": [{"name": "refund", "keywords": ["refund"]}],
    "slots": [
        {"name": "order", "patterns": [r"\b(SO-\d+)\b"]},
        {"name": "carrier", "values": {"SF": ["sf express"], "DHL": ["dhl"]}},
    ],
}
SHIPPED: list[dict[str, Any]] = []


@tool_handler("tests.drift.ship")
def _ship(order: str) -> dict[str, Any]:
    SHIPPED.append({"order": order})
    return {"ok": True, "shipped": order}


@pytest.fixture(autouse=True)
def _no_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tests drive the run: no broker message may wake a worker of a live stack."""
    monkeypatch.setattr("record.dispatch.run_enqueue_on_commit", lambda *args: None)
    monkeypatch.setattr("record.dispatch.run_enqueue", lambda *args: None)
    SHIPPED.clear()


@pytest.fixture
def endpoint(openai_server: FakeModelServer, unique: str, monkeypatch) -> ModelEndpoint:  # noqa: F811
    monkeypatch.setenv(KEY_ENV, "sk-drift-0123456789")
    return ModelEndpoint.objects.create(
        name=f"fake-openai-{unique}", api="openai", base_url=openai_server.base_url,
        model="fake-model-1", api_key_env=KEY_ENV, first_token_timeout_s=5, total_timeout_s=10,
    )  # fmt: skip


def _session(endpoint: ModelEndpoint, **fields: Any) -> Session:
    agent = AgentFactory.create(
        slug=f"drift-{uuid.uuid4().hex[:8]}", model=endpoint, rules=[], **fields
    )
    return SessionFactory.create(agent=agent, owner=UserFactory(username="drift-owner"))


def _pause(session: Session, seconds: float) -> None:
    """As if the conversation had rested `seconds`: its messages and calls are older."""
    back = timedelta(seconds=seconds)
    Message.objects.filter(session=session).update(created_at=F("created_at") - back)
    ToolCall.objects.filter(session=session).update(created_at=F("created_at") - back)


def _turn(server: FakeModelServer, session: Session, text: str) -> list[str]:
    """One turn answered by the model; the drift notes this turn added (each one in the
    request the model received)."""
    server.script(Reply(text="Noted."))
    message_post(session=session, content=text)
    assert session_run(session_id=session.pk).stopped == "idle"
    row = Session.objects.get(pk=session.pk)
    assert row.state == "finished"
    added = [
        m.content
        for m in Message.objects.filter(session=session, role="system", turn=row.turn)
        if NOTE in m.content
    ]
    seen = [m["content"] for m in server.requests[-1].messages if m["role"] == "system"]
    assert all(note in seen for note in added)
    return added


def test_after_a_long_pause_the_model_is_told_the_agent_changed(
    openai_server: FakeModelServer,  # noqa: F811
    endpoint: ModelEndpoint,
    settings,
):
    """The user comes back after more than ENV_CHECK_PAUSE_S; meanwhile the agent was
    edited. Starting the new turn moved the session row, so only the model's own last
    message tells the pause."""
    session = _session(endpoint)
    assert _turn(openai_server, session, "hello") == []
    agent = Agent.objects.get(pk=session.agent_id)
    agent.system_prompt = "You now answer in French."
    agent.save()

    _pause(session, settings.ENV_CHECK_PAUSE_S + 60)
    notes = _turn(openai_server, session, "hello again")

    assert len(notes) == 1, notes
    assert "the agent's instructions or configuration were changed" in notes[0]
    assert "Re-plan from the current state before any action with side effects" in notes[0]
    stored = Message.objects.filter(session=session, role="system", content=notes[0])
    assert stored.count() == 1  # in the history, for every later call


def test_without_a_pause_a_change_adds_no_note(
    openai_server: FakeModelServer,  # noqa: F811
    endpoint: ModelEndpoint,
):
    session = _session(endpoint)
    assert _turn(openai_server, session, "hello") == []
    agent = Agent.objects.get(pk=session.agent_id)
    agent.system_prompt = "You now answer in French."
    agent.save()
    assert _turn(openai_server, session, "hello again") == []


def test_the_dialogue_slots_count_and_only_a_drift_past_the_threshold_is_told(
    openai_server: FakeModelServer,  # noqa: F811
    endpoint: ModelEndpoint,
    settings,
):
    """One slot changed after a pause weighs 0.5, under ENV_DRIFT_THRESHOLD (1.0): no
    note. Two changed slots reach it: the note lists both, with what they were."""
    session = _session(endpoint, dialogue=DIALOGUE)
    assert _turn(openai_server, session, "refund SO-1 sent by dhl") == []
    seen = Checkpoint.objects.filter(session=session, context__has_key="seen").latest("step")
    assert seen.context["seen"]["slots"] == {"order": "SO-1", "carrier": "DHL"}

    _pause(session, settings.ENV_CHECK_PAUSE_S + 60)
    assert _turn(openai_server, session, "it is SO-2 actually") == []

    _pause(session, settings.ENV_CHECK_PAUSE_S + 60)
    notes = _turn(openai_server, session, "SO-3, with sf express")

    assert len(notes) == 1, notes
    assert "order is now SO-3 (was SO-2)" in notes[0]
    assert "carrier is now SF (was DHL)" in notes[0]

    settings.ENV_DRIFT_THRESHOLD = 1.5  # the same change, a higher threshold: no note
    _pause(session, settings.ENV_CHECK_PAUSE_S + 60)
    assert _turn(openai_server, session, "SO-4, with dhl") == []


def test_a_side_effect_decided_before_the_drift_is_not_sent_before_the_model_sees_it(
    openai_server: FakeModelServer,  # noqa: F811
    endpoint: ModelEndpoint,
):
    """The model decided to ship; its worker died before sending; meanwhile the agent was
    changed. The recovered run does not ship: the call's result is the drift note, and the
    model re-plans from it."""
    tool: Tool = ToolFactory.create(
        name=f"ship_{uuid.uuid4().hex[:6]}",
        kind="python",
        handler="tests.drift.ship",
        side_effects=True,
        parameters={
            "type": "object",
            "properties": {"order": {"type": "string"}},
            "required": ["order"],
        },
    )
    session = _session(endpoint, tools=[tool.name])
    openai_server.script(Reply(calls=[Call(tool.name, {"order": "SO-9"}, id="call_ship")]))
    message_post(session=session, content="ship SO-9")
    assert lease_acquire(session_id=session.pk, owner=CRASHED, seconds=30)
    model_step(Session.objects.get(pk=session.pk), CRASHED)
    Session.objects.filter(pk=session.pk).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    agent = Agent.objects.get(pk=session.agent_id)
    agent.system_prompt = "Shipping is suspended: never ship."
    agent.save()
    openai_server.script(Reply(text="Shipping is suspended, so I did not ship SO-9."))

    assert session_run(session_id=session.pk).stopped == "idle"

    assert SHIPPED == []
    call = ToolCall.objects.get(session=session)
    assert call.status == "rejected" and call.dispatched_at is None
    told = [m["content"] for m in openai_server.requests[-1].messages if m["role"] == "tool"]
    assert len(told) == 1 and "this call was not sent" in told[0]
    assert "the agent's instructions or configuration were changed" in told[0]
    assert Session.objects.get(pk=session.pk).state == "finished"


def test_a_recovered_side_effect_with_nothing_changed_is_sent(
    openai_server: FakeModelServer,  # noqa: F811
    endpoint: ModelEndpoint,
):
    tool: Tool = ToolFactory.create(
        name=f"ship_{uuid.uuid4().hex[:6]}",
        kind="python",
        handler="tests.drift.ship",
        side_effects=True,
        parameters={
            "type": "object",
            "properties": {"order": {"type": "string"}},
            "required": ["order"],
        },
    )
    session = _session(endpoint, tools=[tool.name])
    openai_server.script(Reply(calls=[Call(tool.name, {"order": "SO-8"}, id="call_ship")]))
    message_post(session=session, content="ship SO-8")
    assert lease_acquire(session_id=session.pk, owner=CRASHED, seconds=30)
    model_step(Session.objects.get(pk=session.pk), CRASHED)
    Session.objects.filter(pk=session.pk).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    openai_server.script(Reply(text="Shipped."))

    assert session_run(session_id=session.pk).stopped == "idle"
    assert SHIPPED == [{"order": "SO-8"}]


def test_a_change_a_recovered_tool_step_recorded_is_still_told_to_the_model(
    openai_server: FakeModelServer,  # noqa: F811
    endpoint: ModelEndpoint,
):
    """A read-only call is not held back; its results' commit records the new
    environment. The model has not seen that one: its next step still gets the note."""
    tool: Tool = ToolFactory.create(
        name=f"look_{uuid.uuid4().hex[:6]}",
        kind="python",
        handler="tests.drift.ship",
        side_effects=False,
        parameters={
            "type": "object",
            "properties": {"order": {"type": "string"}},
            "required": ["order"],
        },
    )
    session = _session(endpoint, tools=[tool.name])
    openai_server.script(Reply(calls=[Call(tool.name, {"order": "SO-7"}, id="call_look")]))
    message_post(session=session, content="look at SO-7")
    assert lease_acquire(session_id=session.pk, owner=CRASHED, seconds=30)
    model_step(Session.objects.get(pk=session.pk), CRASHED)
    Session.objects.filter(pk=session.pk).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    agent = Agent.objects.get(pk=session.agent_id)
    agent.system_prompt = "Answer in French."
    agent.save()
    openai_server.script(Reply(text="SO-7 est en route."))

    assert session_run(session_id=session.pk).stopped == "idle"

    assert SHIPPED == [{"order": "SO-7"}]
    notes = [
        m["content"]
        for m in openai_server.requests[-1].messages
        if m["role"] == "system" and NOTE in m["content"]
    ]
    assert len(notes) == 1 and "the agent's instructions or configuration were changed" in notes[0]


def _ship_tool() -> Tool:
    return ToolFactory.create(
        name=f"ship_{uuid.uuid4().hex[:6]}",
        kind="python",
        handler="tests.drift.ship",
        side_effects=True,
        parameters={
            "type": "object",
            "properties": {"order": {"type": "string"}},
            "required": ["order"],
        },
    )


def test_the_articles_example_decided_in_peak_hours_resumed_after_them(
    openai_server: FakeModelServer,  # noqa: F811
    endpoint: ModelEndpoint,
    settings,
):
    """runtime-mechanisms 4.3: the checkpoint was made in the agent's peak hours, the run
    continues after them. is_peak_hour flipped: the shipment the model decided in peak
    hours is not sent; its result is the drift note, and the model re-plans from it."""
    now = timezone.now()
    window = f"{now - timedelta(hours=1):%H:%M}-{now + timedelta(hours=1):%H:%M}"
    tool = _ship_tool()
    session = _session(endpoint, tools=[tool.name], peak_hours=[window], timezone="UTC")
    openai_server.script(Reply(calls=[Call(tool.name, {"order": "SO-9"}, id="call_ship")]))
    message_post(session=session, content="ship SO-9")
    assert lease_acquire(session_id=session.pk, owner=CRASHED, seconds=30)
    model_step(Session.objects.get(pk=session.pk), CRASHED)
    seen = Checkpoint.objects.filter(session=session, context__has_key="seen").latest("step")
    assert seen.context["seen"]["peak"] is True
    assert "is_peak_hour true" in _environment_block(openai_server.requests[-1])
    Session.objects.filter(pk=session.pk).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    settings.ENV_CLOCK_SHIFT_S = 3 * 3600  # the worker comes back three hours later
    openai_server.script(Reply(text="Peak hours are over; I will ship SO-9 by the normal route."))

    assert session_run(session_id=session.pk).stopped == "idle"

    assert SHIPPED == []
    call = ToolCall.objects.get(session=session)
    assert call.status == "rejected" and call.dispatched_at is None
    request = openai_server.requests[-1]
    told = [m["content"] for m in request.messages if m["role"] == "tool"]
    assert len(told) == 1 and "this call was not sent" in told[0]
    assert "the peak hours are over (is_peak_hour false)" in told[0]
    assert "is_peak_hour false" in _environment_block(request)
    assert Session.objects.get(pk=session.pk).state == "finished"


def test_the_same_run_resumed_still_in_peak_hours_ships(
    openai_server: FakeModelServer,  # noqa: F811
    endpoint: ModelEndpoint,
):
    now = timezone.now()
    window = f"{now - timedelta(hours=2):%H:%M}-{now + timedelta(hours=2):%H:%M}"
    tool = _ship_tool()
    session = _session(endpoint, tools=[tool.name], peak_hours=[window], timezone="UTC")
    openai_server.script(Reply(calls=[Call(tool.name, {"order": "SO-8"}, id="call_ship")]))
    message_post(session=session, content="ship SO-8")
    assert lease_acquire(session_id=session.pk, owner=CRASHED, seconds=30)
    model_step(Session.objects.get(pk=session.pk), CRASHED)
    Session.objects.filter(pk=session.pk).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    openai_server.script(Reply(text="Shipped."))

    assert session_run(session_id=session.pk).stopped == "idle"
    assert SHIPPED == [{"order": "SO-8"}]


def _environment_block(request: Any) -> str:
    return next(
        m["content"]
        for m in request.messages
        if m["role"] == "system" and m["content"].startswith("Environment (from the platform")
    )


def _failed_calls(tool: str, count: int) -> None:
    """Another session's calls of `tool` that failed: the platform's own record of it."""
    other = SessionFactory.create(agent=AgentFactory.create(), owner=UserFactory())
    ToolCall.objects.bulk_create(
        ToolCall(
            session=other, turn=1, step=1, position=i, call_id=f"f{i}", tool_name=tool,
            status="failed", elapsed_ms=800, idempotency_key=uuid.uuid4().hex,
        )
        for i in range(count)
    )  # fmt: skip


def test_a_tool_falling_under_its_sla_during_a_pause_is_told(
    openai_server: FakeModelServer,  # noqa: F811
    endpoint: ModelEndpoint,
    settings,
):
    settings.ENV_TOOL_STATS_TTL_S = 0
    settings.ENV_SLA_MIN_CALLS = 5
    tool = _ship_tool()
    Tool.objects.filter(pk=tool.pk).update(sla_rate=0.95)
    session = _session(endpoint, tools=[tool.name])
    assert _turn(openai_server, session, "hello") == []
    assert f"{tool.name} sla_rate 0.95 (no recent calls)" in _environment_block(
        openai_server.requests[-1]
    )

    _failed_calls(tool.name, 6)
    _pause(session, settings.ENV_CHECK_PAUSE_S + 60)
    notes = _turn(openai_server, session, "hello again")

    assert len(notes) == 1, notes
    assert f"tool {tool.name}: success rate under its SLA" in notes[0]
    block = _environment_block(openai_server.requests[-1])
    assert f"{tool.name} success_rate 0 of 6, sla_rate 0.95 (under it), p50_ms 800" in block


def test_host_pressure_that_started_during_a_pause_is_told(
    openai_server: FakeModelServer,  # noqa: F811
    endpoint: ModelEndpoint,
    settings,
):
    session = _session(endpoint)
    assert _turn(openai_server, session, "hello") == []
    assert "host cpu_load" in _environment_block(openai_server.requests[-1])

    settings.ENV_HOST_MEM_LOW_MB = 10**9  # every host is short of memory now
    _pause(session, settings.ENV_CHECK_PAUSE_S + 60)
    notes = _turn(openai_server, session, "hello again")

    assert len(notes) == 1 and "the host is under memory pressure" in notes[0], notes
