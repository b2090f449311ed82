"""Degradation levels: from pressure (unit), and what each level does to a real turn."""

import time

import pytest

from billing.degradation import Pressure, degradation_level
from engine import session_run
from record.models import Event, ModelCall, Session, ToolCall
from sessions.services import message_post
from tests.factories import ModelEndpointFactory, ToolFactory
from tests.fakes.model_servers import FakeModelServer, Reply
from tests.sessions.conftest import make_agent, make_session, owner, rules_model  # noqa: F401


@pytest.mark.parametrize(
    ("pressure", "level"),
    [
        (Pressure(), 0),
        (Pressure(budget_used=0.85), 1),
        (Pressure(budget_used=0.95), 2),
        (Pressure(budget_used=0.99), 3),
        (Pressure(model_failing=True), 1),
        (Pressure(queue_depth=3000), 2),
        (Pressure(credits_left=0.7), 1),
        (Pressure(credits_left=0.2), 2),
        (Pressure(credits_left=0.0), 3),
        (Pressure(budget_used=0.85, credits_left=0.2), 2),
        (Pressure(workers_unhealthy=0.4), 0),
        (Pressure(workers_unhealthy=0.5), 1),
        (Pressure(workers_unhealthy=0.8), 2),
        (Pressure(workers_unhealthy=1.0), 3),
    ],
)
def test_the_level_is_the_highest_any_pressure_calls_for(pressure: Pressure, level: int) -> None:
    assert degradation_level(pressure) == level


def _run(session: Session) -> Session:
    started = time.monotonic()
    assert session_run(session_id=session.pk).stopped == "idle"
    assert time.monotonic() - started < 20
    return Session.objects.get(pk=session.pk)


@pytest.mark.django_db(transaction=True)
def test_level_three_runs_only_critical_tools_and_says_so(make_agent, make_session):  # noqa: F811
    ToolFactory(name="clock", roles=[])
    ToolFactory(name="vital_clock", roles=[], critical=True)
    # 99% of the session budget spent: level 3 (DEGRADE_BUDGET_SHARES).
    agent = make_agent(
        tools=["clock", "vital_clock"],
        budget_session_tokens=10**9,
        rules=[
            {
                "when": {"last_tool": None},
                "tool_calls": [{"tool": "clock"}, {"tool": "vital_clock"}],
            },
            {"answer": "done"},
        ],
    )
    session = make_session(agent=agent, input_tokens=99 * 10**7)
    message_post(session=session, content="go")
    session = _run(session)

    assert session.degradation_level == 3
    calls = {c.tool_name: c for c in ToolCall.objects.filter(session=session)}
    assert calls["vital_clock"].status == "success"
    assert calls["clock"].status == "failed"
    assert calls["clock"].output["error"]["code"] == "degraded"
    changed = Event.objects.filter(session=session, type="progress", data__stage="degradation")
    assert [e.data["level"] for e in changed] == [3]  # one event: the level changed once


def _level_one_turn(make_agent, make_session, cheap):  # type: ignore[no-untyped-def]  # noqa: F811
    """A turn of a session 85 % into its token budget (level 1), the agent's cheap model `cheap`."""
    agent = make_agent(
        cheap_model=cheap,
        degraded_max_tokens=200,
        budget_session_tokens=10**9,
        rules=[{"answer": "ok"}],
    )
    session = make_session(agent=agent, input_tokens=85 * 10**7)
    message_post(session=session, content="hi")
    return agent, _run(session)


@pytest.mark.django_db(transaction=True)
def test_level_one_uses_the_cheaper_model_with_a_lower_output_limit(make_agent, make_session):  # noqa: F811
    cheap = ModelEndpointFactory(name="cheap-rules", api="rules", options={})
    _, session = _level_one_turn(make_agent, make_session, cheap)

    assert session.degradation_level == 1
    call = ModelCall.objects.get(session=session)
    assert call.endpoint_name == "cheap-rules"
    assert Event.objects.filter(session=session, type="progress", data__level=1).count() == 1


@pytest.mark.django_db(transaction=True)
def test_level_one_lowers_the_requests_output_limit_on_the_wire(
    make_agent,  # noqa: F811
    make_session,  # noqa: F811
    openai_server: FakeModelServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The cheaper model is asked for at most `degraded_max_tokens`: read from the request
    the model server received, not from the platform's own record of it."""
    monkeypatch.setenv("FAKE_DEGRADED_KEY", "sk-degraded")
    cheap = ModelEndpointFactory(
        name="cheap-wire",
        api="openai",
        base_url=openai_server.base_url,
        model="fake-cheap",
        api_key_env="FAKE_DEGRADED_KEY",
    )
    openai_server.script(Reply(text="ok"))
    _, session = _level_one_turn(make_agent, make_session, cheap)

    assert session.degradation_level == 1
    (request,) = openai_server.requests
    assert request.body["max_tokens"] == 200


@pytest.mark.django_db(transaction=True)
def test_level_two_defers_side_effects_but_runs_reads_and_critical_tools(
    make_agent,  # noqa: F811
    make_session,  # noqa: F811
) -> None:
    """95 % of the session budget spent: level 2. A non-critical tool with side effects is
    deferred (told to the model as `degraded`); a read-only tool and a critical tool with
    side effects still run."""
    ToolFactory(name="clock", roles=[])
    ToolFactory(name="stamp_clock", roles=[], side_effects=True, handler="builtin.current_time")
    ToolFactory(
        name="vital_stamp",
        roles=[],
        side_effects=True,
        critical=True,
        handler="builtin.current_time",
    )
    agent = make_agent(
        tools=["clock", "stamp_clock", "vital_stamp"],
        budget_session_tokens=10**9,
        rules=[
            {
                "when": {"last_tool": None},
                "tool_calls": [{"tool": "clock"}, {"tool": "stamp_clock"}, {"tool": "vital_stamp"}],
            },
            {"answer": "done"},
        ],
    )
    session = make_session(agent=agent, input_tokens=95 * 10**7)
    message_post(session=session, content="go")
    session = _run(session)

    assert session.degradation_level == 2
    calls = {c.tool_name: c for c in ToolCall.objects.filter(session=session)}
    assert calls["stamp_clock"].status == "failed"
    assert calls["stamp_clock"].output["error"]["code"] == "degraded"
    assert calls["stamp_clock"].output["error"]["level"] == 2
    assert calls["clock"].status == "success"
    assert calls["vital_stamp"].status == "success"


@pytest.mark.django_db(transaction=True)
def test_level_one_skips_a_disabled_cheaper_model(make_agent, make_session):  # noqa: F811
    cheap = ModelEndpointFactory(name="cheap-off", api="rules", options={}, enabled=False)
    agent, session = _level_one_turn(make_agent, make_session, cheap)

    assert session.degradation_level == 1
    assert ModelCall.objects.get(session=session).endpoint_name == agent.model.name


@pytest.mark.django_db(transaction=True)
def test_workers_over_their_thresholds_degrade_a_real_turn(make_agent, make_session):  # noqa: F811
    """Two live workers, one taking no new runs (its heartbeat in Redis): level 1, so
    the turn runs on the cheaper model."""
    from runtime import health

    cheap = ModelEndpointFactory(name="cheap-rules", api="rules", options={})
    agent = make_agent(cheap_model=cheap, rules=[{"answer": "ok"}])
    session = make_session(agent=agent)
    base = health.Report(
        name="w1@test", pid=1, at=time.time(), inflight=0, steps=0, step_p50_s=0.0,
        step_p95_s=0.0, error_rate=0.0, model_p95_s=0.0, cpu_percent=0.0, rss_mb=10.0,
        accepting=True, reasons=[],
    )  # fmt: skip
    sick = health.Report(**{**base.__dict__, "name": "w2@test", "accepting": False})
    for report in (base, sick):
        health.report_publish(report, ttl_s=30)
    health.cache_reset()
    try:
        message_post(session=session, content="hi")
        session = _run(session)
    finally:
        health.report_withdraw(base.name)
        health.report_withdraw(sick.name)
        health.cache_reset()

    assert session.degradation_level == 1
    assert ModelCall.objects.get(session=session).endpoint_name == "cheap-rules"
