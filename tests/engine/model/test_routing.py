"""Routing in a real run (in-process engine, real fake servers): fallback, busy answer, refusals,
live switching, sticky rollout, usage and cost, and keys kept out of every record."""

import json
import logging
import math
import time
import uuid
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest
from django.urls import reverse

from billing import pressure
from engine import session_run
from engine.model.calls import (
    _scrub,
    endpoint_config,
    endpoint_tokenizer,
    primary_endpoint,
    rollout_bucket,
)
from engine.phases.model import BUSY_ANSWER
from llm.base import ModelUnavailable
from llm.prompt_tools import GAVE_UP_ANSWER
from memory.tokens import count_tokens
from record.models import (
    Agent,
    Checkpoint,
    Event,
    Message,
    ModelCall,
    ModelEndpoint,
    Session,
    ToolCall,
    Transition,
)
from runtime import health
from sessions.services import message_post
from tests.factories import (
    AgentFactory,
    ModelEndpointFactory,
    SessionFactory,
    ToolFactory,
    UserFactory,
)
from tests.fakes.model_servers import Call, FakeModelServer, Reply
from tests.llm.conftest import KEY_ENV
from tools.registry import tool_handler

pytestmark = pytest.mark.django_db(transaction=True)

BUSY = "We are a bit busy, please try again shortly."


@pytest.fixture(autouse=True)
def _no_pressure(settings: Any) -> Any:
    """Routing and fallback alone: no pressure from the rest of the lane (its queue, the
    workers' health, both read through per-process caches) may degrade these steps to
    the cheaper tier; degradation has tests of its own (tests/billing, tests/engine/gates)."""
    never = [float("inf")] * 3
    settings.DEGRADE_QUEUE_DEPTHS, settings.DEGRADE_WORKER_SHARES = never, never
    health.cache_reset()
    pressure._queue_seen[:] = [0.0, 0.0]
    yield
    health.cache_reset()


@tool_handler("tests.adapters.lookup")
def _lookup(days: int = 7) -> dict[str, Any]:
    return {"count": 2, "days": days}


@tool_handler("tests.adapters.switch_model")
def _switch_model(agent: str, endpoint: str) -> dict[str, Any]:
    """An operator's edit in the middle of a turn, made while the tool runs."""
    Agent.objects.filter(slug=agent).update(model=ModelEndpoint.objects.get(name=endpoint))
    return {"ok": True}


@pytest.fixture
def make_endpoint(unique: str, api_key: str) -> Callable[..., ModelEndpoint]:
    counter = iter(range(100))

    def make(
        server: FakeModelServer | None, api: str | None = None, **fields: Any
    ) -> ModelEndpoint:
        api = api or (server.api if server else "rules")
        fields.setdefault("name", f"{api}-{unique}-{next(counter)}")
        fields.setdefault("model", f"{api}-model")
        fields.setdefault("api_key_env", KEY_ENV)
        fields.setdefault("first_token_timeout_s", 2.0)
        fields.setdefault("total_timeout_s", 10.0)
        endpoint: ModelEndpoint = ModelEndpointFactory(
            api=api, base_url=server.base_url if server else "", **fields
        )
        return endpoint

    return make


@pytest.fixture
def lookup_tool(db):  # type: ignore[no-untyped-def]
    return ToolFactory(
        name="lookup",
        handler="tests.adapters.lookup",
        parameters={
            "type": "object",
            "properties": {"days": {"type": "integer"}},
            "additionalProperties": False,
        },
    )


@pytest.fixture
def make_agent(unique: str) -> Callable[..., Agent]:
    counter = iter(range(100))

    def make(model: ModelEndpoint, **fields: Any) -> Agent:
        fields.setdefault("slug", f"agent-{unique}-{next(counter)}")
        fields.setdefault("busy_message", BUSY)
        fields.setdefault("rules", [])
        agent: Agent = AgentFactory(model=model, **fields)
        return agent

    return make


@pytest.fixture
def owner(db):  # type: ignore[no-untyped-def]
    return UserFactory(username="adapter-owner")


def run_turn(session: Session, content: str = "find my orders") -> Session:
    message_post(session=session, content=content)
    started = time.monotonic()
    result = session_run(session_id=session.pk)
    assert result.stopped == "idle", result
    assert time.monotonic() - started < 20
    return Session.objects.get(pk=session.pk)


def new_session(agent: Agent, owner: Any, **fields: Any) -> Session:
    session: Session = SessionFactory(agent=agent, owner=owner, role="support", **fields)
    return session


def events(session: Session, type_: str | None = None) -> list[Event]:
    rows = Event.objects.filter(session=session).order_by("seq")
    return list(rows.filter(type=type_) if type_ else rows)


def calls(session: Session) -> list[ModelCall]:
    return list(ModelCall.objects.filter(session=session).order_by("id"))


def assistant_texts(session: Session) -> list[str]:
    return list(
        Message.objects.filter(session=session, role="assistant")
        .order_by("seq")
        .values_list("content", flat=True)
    )


# Fallback ------------------------------------------------------------------------------


def test_a_failing_primary_falls_back_once_and_the_fallback_answers(
    openai_server, anthropic_server, make_endpoint, make_agent, owner
):
    primary, fallback = make_endpoint(openai_server), make_endpoint(anthropic_server)
    session = new_session(make_agent(primary, fallback_model=fallback), owner)
    openai_server.script(Reply(status=500))
    anthropic_server.script(Reply(text="The fallback model answers.", usage=(40, 6)))

    session = run_turn(session)

    assert session.state == "finished" and session.last_error == ""
    assert assistant_texts(session) == ["The fallback model answers."]
    rows = calls(session)
    assert [(c.endpoint_name, c.api, c.outcome, c.retried, c.fallback_used) for c in rows] == [
        (primary.name, "openai", "unavailable", False, False),
        (fallback.name, "anthropic", "success", True, True),
    ]
    assert "HTTP 500" in rows[0].error and rows[1].error == ""
    assert (rows[1].input_tokens, rows[1].output_tokens) == (40, 6)
    assert events(session, "turn.finished")[-1].data["stop_reason"] == "answer"
    assert (len(openai_server.requests), len(anthropic_server.requests)) == (1, 1)


@pytest.mark.parametrize(
    "failure",
    [
        Reply(status=503),
        Reply(status=429, headers={"Retry-After": "1"}),
        Reply(text="half an answer", cut_after=3),
        Reply(text=""),
    ],
    ids=["503", "429", "cut-stream", "empty-answer"],
)
def test_every_retryable_failure_falls_back(
    openai_server, anthropic_server, make_endpoint, make_agent, owner, failure
):
    primary, fallback = make_endpoint(openai_server), make_endpoint(anthropic_server)
    session = new_session(make_agent(primary, fallback_model=fallback), owner)
    openai_server.script(failure)
    anthropic_server.script(Reply(text="Recovered."))
    session = run_turn(session)
    assert assistant_texts(session) == ["Recovered."]  # no half message from the primary
    assert [c.outcome for c in calls(session)][1] == "success"
    assert calls(session)[0].outcome in ("unavailable", "rate_limited", "protocol_error")


def test_when_both_fail_the_busy_message_answers_and_nothing_retries_again(
    openai_server, anthropic_server, make_endpoint, make_agent, owner
):
    primary = make_endpoint(openai_server)
    fallback = make_endpoint(anthropic_server, first_token_timeout_s=0.5)
    session = new_session(make_agent(primary, fallback_model=fallback), owner)
    openai_server.script(Reply(status=500), Reply(status=500), Reply(status=500))
    anthropic_server.script(Reply(hang=True), Reply(hang=True), Reply(hang=True))

    session = run_turn(session)

    assert session.state == "finished"
    assert assistant_texts(session) == [BUSY]
    finished = events(session, "turn.finished")[-1].data
    assert finished["stop_reason"] == "model_unavailable"
    assert [(c.outcome, c.retried, c.fallback_used) for c in calls(session)] == [
        ("unavailable", False, False),
        ("timeout", True, True),
    ]
    timeout = calls(session)[1]
    assert timeout.total_ms >= 450 and timeout.first_token_ms is None  # a failure is timed too
    assert len(openai_server.requests) + len(anthropic_server.requests) == 2  # exactly one retry
    assert "within 0.5 s" in session.last_error
    assert not events(session, "error")
    assert Transition.objects.filter(session=session).order_by("-id").first().to_state == "finished"  # type: ignore[union-attr]


def test_no_fallback_configured_means_one_request_then_the_busy_message(
    openai_server, make_endpoint, make_agent, owner
):
    session = new_session(make_agent(make_endpoint(openai_server)), owner)
    openai_server.script(Reply(status=502))
    session = run_turn(session)
    assert assistant_texts(session) == [BUSY] and len(openai_server.requests) == 1
    assert events(session, "turn.finished")[-1].data["stop_reason"] == "model_unavailable"


def test_a_blank_busy_message_still_gives_a_busy_answer(
    openai_server, make_endpoint, make_agent, owner
):
    session = new_session(make_agent(make_endpoint(openai_server), busy_message=""), owner)
    openai_server.script(Reply(status=500))
    session = run_turn(session)
    assert assistant_texts(session) == [BUSY_ANSWER]


def test_a_400_is_not_retried_and_the_user_gets_the_busy_message_with_the_reason_recorded(
    openai_server, anthropic_server, make_endpoint, make_agent, owner, caplog
):
    primary, fallback = make_endpoint(openai_server), make_endpoint(anthropic_server)
    session = new_session(make_agent(primary, fallback_model=fallback), owner)
    openai_server.script(Reply(status=400, error_message="Unknown model 'openai-model'"))

    with caplog.at_level(logging.WARNING, logger="engine.model.calls"):
        session = run_turn(session)

    # The user is not left in silence: the agent's busy message ends the turn normally.
    assert session.state == "finished"
    assert assistant_texts(session) == [BUSY]
    assert events(session, "turn.finished")[-1].data["stop_reason"] == "model_refused"
    assert anthropic_server.requests == []  # a refusal is not retried
    # The operator sees why: the call, the session, the transition and one log line.
    assert [(c.outcome, c.retried) for c in calls(session)] == [("bad_request", False)]
    assert "HTTP 400" in calls(session)[0].error and "Unknown model" in session.last_error
    last = Transition.objects.filter(session=session).order_by("-id").first()
    assert last is not None and last.reason.startswith("model_refused: request refused (HTTP 400)")
    (line,) = [r.getMessage() for r in caplog.records if r.name == "engine.model.calls"]
    assert line.startswith(
        f"model call failed: endpoint={primary.name} url={primary.base_url} status=400 "
        "reason=request refused (HTTP 400)"
    )
    assert "Unknown model" in line

    # The next message starts a new turn normally once the operator fixed things.
    openai_server.script(Reply(text="Fixed now."))
    session = run_turn(session, "again")
    assert session.state == "finished" and assistant_texts(session) == [BUSY, "Fixed now."]
    assert session.last_error == ""


def test_a_missing_key_is_never_sent_the_fallback_answers_and_the_operator_is_told(
    openai_server, make_endpoint, make_agent, owner, monkeypatch, caplog
):
    monkeypatch.delenv("UNSET_TEST_MODEL_KEY", raising=False)
    primary = make_endpoint(openai_server, api_key_env="UNSET_TEST_MODEL_KEY")
    assert primary.missing_key_env == "UNSET_TEST_MODEL_KEY"  # what the admin shows
    fallback = make_endpoint(None, api="rules", api_key_env="")
    agent = make_agent(primary, fallback_model=fallback, rules=[{"answer": "From the rules."}])

    with caplog.at_level(logging.WARNING, logger="engine.model.calls"):
        session = run_turn(new_session(agent, owner))

    assert openai_server.requests == []  # no request went out without its key
    assert assistant_texts(session) == ["From the rules."]
    (refused, answered) = calls(session)
    assert (refused.outcome, answered.outcome, answered.fallback_used) == (
        "bad_request",
        "success",
        True,
    )
    assert refused.error == (
        f"'{primary.name}' has no API key: environment variable UNSET_TEST_MODEL_KEY is not set"
    )
    (line,) = [r.getMessage() for r in caplog.records if r.name == "engine.model.calls"]
    assert line == (
        f"model call failed: endpoint={primary.name} url={primary.base_url} status=bad_request "
        f"reason={refused.error}"
    )

    # Without a fallback the user gets the busy message, the operator the variable's name.
    session = run_turn(new_session(make_agent(primary), owner))
    assert assistant_texts(session) == [BUSY] and openai_server.requests == []
    assert events(session, "turn.finished")[-1].data["stop_reason"] == "model_refused"
    assert "UNSET_TEST_MODEL_KEY is not set" in session.last_error


def test_the_admin_marks_an_endpoint_whose_key_variable_is_unset(
    admin_client, make_endpoint, monkeypatch
):
    monkeypatch.delenv("UNSET_TEST_MODEL_KEY", raising=False)
    make_endpoint(None, api="openai", name="keyless", api_key_env="UNSET_TEST_MODEL_KEY")
    make_endpoint(None, api="openai", name="keyed")  # its variable is set by the fixture
    page = admin_client.get(
        reverse("admin:agent_sessions_modelendpoint_changelist")
    ).content.decode()
    assert "misconfigured: UNSET_TEST_MODEL_KEY is not set" in page
    assert f"from {KEY_ENV}" in page
    endpoint = ModelEndpoint.objects.get(name="keyless")
    page = admin_client.get(
        reverse("admin:agent_sessions_modelendpoint_change", args=[endpoint.pk])
    ).content.decode()
    assert "misconfigured: UNSET_TEST_MODEL_KEY is not set" in page


def test_a_request_too_large_for_the_window_is_refused_before_sending(
    openai_server, anthropic_server, make_endpoint, make_agent, owner
):
    tiny = make_endpoint(openai_server, context_window=10)
    roomy = make_endpoint(anthropic_server)
    session = new_session(
        make_agent(tiny, fallback_model=roomy, system_prompt="You are a helpful assistant " * 5),
        owner,
    )
    anthropic_server.script(Reply(text="Plenty of room here."))

    session = run_turn(session)

    assert openai_server.requests == []  # nothing sent
    first, second = calls(session)
    assert (first.outcome, first.endpoint_name, first.input_tokens) == ("too_large", tiny.name, 0)
    assert "10-token window" in first.error
    assert (second.outcome, second.fallback_used) == ("success", True)
    assert assistant_texts(session) == ["Plenty of room here."]


def test_too_large_everywhere_answers_busy_without_any_request(
    openai_server, make_endpoint, make_agent, owner
):
    session = new_session(make_agent(make_endpoint(openai_server, context_window=5)), owner)
    session = run_turn(session)
    assert openai_server.requests == [] and assistant_texts(session) == [BUSY]
    assert [c.outcome for c in calls(session)] == ["too_large"]


# Live switching ------------------------------------------------------------------------


def test_an_agent_edit_between_two_steps_of_one_turn_takes_effect_at_the_next_step(
    openai_server, anthropic_server, make_endpoint, make_agent, owner
):
    first, second = make_endpoint(openai_server), make_endpoint(anthropic_server)
    ToolFactory(
        name="switch_model",
        handler="tests.adapters.switch_model",
        parameters={
            "type": "object",
            "properties": {"agent": {"type": "string"}, "endpoint": {"type": "string"}},
        },
    )
    agent = make_agent(first, tools=["switch_model"])
    session = new_session(agent, owner)
    openai_server.script(
        Reply(calls=[Call("switch_model", {"agent": agent.slug, "endpoint": second.name})])
    )
    anthropic_server.script(Reply(text="Answered by the new model."))

    session = run_turn(session)

    assert session.state == "finished"
    assert [c.endpoint_name for c in calls(session)] == [first.name, second.name]
    assert assistant_texts(session)[-1] == "Answered by the new model."
    # The new model saw the whole turn, tool call and result included, in its own format.
    (request,) = anthropic_server.requests
    blocks = [b for m in request.messages for b in m["content"]]
    assert [b["type"] for b in blocks] == ["text", "tool_use", "tool_result"]
    assert blocks[2]["tool_use_id"] == blocks[1]["id"] and "ok" in str(request.last_tool_result())


def test_an_endpoint_edit_between_turns_takes_effect_without_a_restart(
    openai_server, anthropic_server, make_endpoint, make_agent, owner
):
    endpoint = make_endpoint(openai_server)
    session = new_session(make_agent(endpoint), owner)
    openai_server.script(Reply(text="From OpenAI."))
    session = run_turn(session)

    ModelEndpoint.objects.filter(pk=endpoint.pk).update(
        api="anthropic", base_url=anthropic_server.base_url, model="claude-x"
    )
    anthropic_server.script(Reply(text="From Anthropic."))
    session = run_turn(session, "and now?")

    assert assistant_texts(session) == ["From OpenAI.", "From Anthropic."]
    assert [(c.api, c.model) for c in calls(session)] == [
        ("openai", "openai-model"),
        ("anthropic", "claude-x"),
    ]
    assert anthropic_server.requests[0].body["model"] == "claude-x"
    assert [m["role"] for m in anthropic_server.requests[0].messages] == [
        "user",
        "assistant",
        "user",
    ]


# Rollout -------------------------------------------------------------------------------


def test_rollout_buckets_are_stable_and_spread(db):
    ids = [uuid.uuid5(uuid.NAMESPACE_URL, f"session-{i}") for i in range(1000)]
    buckets = [rollout_bucket(i) for i in ids]
    assert buckets == [rollout_bucket(i) for i in ids] == [rollout_bucket(str(i)) for i in ids]
    assert all(0 <= b < 100 for b in buckets)
    assert 80 <= sum(b < 10 for b in buckets) <= 120  # ~10% below 10


def test_thirty_percent_rollout_over_200_sessions_is_sticky(
    openai_server, anthropic_server, make_endpoint, make_agent, owner
):
    main, candidate = make_endpoint(openai_server), make_endpoint(anthropic_server)
    agent = make_agent(main, candidate_model=candidate, candidate_percent=30)
    # Fixed ids: with random ones the share strays outside 20-40 % about once in 2,500 runs.
    ids = [uuid.uuid5(uuid.NAMESPACE_URL, f"rollout-{i}") for i in range(200)]
    sessions = [Session(id=i, agent=agent) for i in ids]

    picks = [primary_endpoint(agent, s) for s in sessions]
    share = sum(rollout for _endpoint, rollout in picks) / len(sessions)
    assert 0.2 <= share <= 0.4
    assert all((endpoint.pk == candidate.pk) == rollout for endpoint, rollout in picks)
    assert [primary_endpoint(agent, s) for s in sessions] == picks  # sticky
    # Raising the share keeps everyone already on the candidate there.
    agent.candidate_percent = 60
    assert all(
        primary_endpoint(agent, s)[1]
        for s, (_e, rollout) in zip(sessions, picks, strict=True)
        if rollout
    )
    # A disabled candidate is never used.
    candidate.enabled = False
    assert not any(primary_endpoint(agent, s)[1] for s in sessions)


def test_rollout_in_real_runs_keeps_each_session_on_its_model(
    openai_server, anthropic_server, make_endpoint, make_agent, owner
):
    main, candidate = make_endpoint(openai_server), make_endpoint(anthropic_server)
    agent = make_agent(main, candidate_model=candidate, candidate_percent=30)
    inside = [i for i in (uuid.uuid4() for _ in range(400)) if rollout_bucket(i) < 30][:2]
    outside = [i for i in (uuid.uuid4() for _ in range(400)) if rollout_bucket(i) >= 30][:2]
    openai_server.script(*[Reply(text="main answer") for _ in range(4)])
    anthropic_server.script(*[Reply(text="candidate answer") for _ in range(4)])

    for session_id in inside + outside:
        session = new_session(agent, owner, id=session_id)
        run_turn(session, "one")
        run_turn(session, "two")
        rows = calls(session)
        on_candidate = session_id in inside
        assert [c.rollout for c in rows] == [on_candidate, on_candidate]
        assert {c.endpoint_name for c in rows} == {candidate.name if on_candidate else main.name}
        assert (
            assistant_texts(session) == ["candidate answer" if on_candidate else "main answer"] * 2
        )
    assert (len(openai_server.requests), len(anthropic_server.requests)) == (4, 4)


def test_a_failing_candidate_falls_back_to_the_fallback_not_to_the_main_model(
    openai_server, anthropic_server, make_endpoint, make_agent, owner
):
    main, candidate = make_endpoint(openai_server), make_endpoint(anthropic_server)
    fallback = make_endpoint(None, api="rules", name=f"rules-{uuid.uuid4().hex[:8]}")
    agent = make_agent(
        main,
        candidate_model=candidate,
        candidate_percent=100,
        fallback_model=fallback,
        rules=[{"answer": "rules answer"}],
    )
    anthropic_server.script(Reply(status=500))
    session = run_turn(new_session(agent, owner))
    assert [(c.endpoint_name, c.rollout, c.fallback_used) for c in calls(session)] == [
        (candidate.name, True, False),
        (fallback.name, False, True),
    ]
    assert assistant_texts(session) == ["rules answer"] and openai_server.requests == []


# Usage and cost ------------------------------------------------------------------------


def test_usage_and_cost_from_the_provider(
    openai_server, make_endpoint, make_agent, owner, lookup_tool
):
    endpoint = make_endpoint(
        openai_server, price_input_per_1k=Decimal("0.15"), price_output_per_1k=Decimal("0.60")
    )
    session = new_session(make_agent(endpoint, tools=["lookup"]), owner)
    openai_server.script(
        Reply(calls=[Call("lookup", {"days": 3})], usage=(1000, 500), delay_s=0.02),
        Reply(text="Two orders.", usage=(2000, 100)),
    )
    session = run_turn(session)

    first, second = calls(session)
    assert (first.input_tokens, first.output_tokens, first.tokens_estimated) == (1000, 500, False)
    assert first.cost == Decimal("0.450000")  # 1000 x 0.15 / 1000 + 500 x 0.60 / 1000
    assert second.cost == Decimal("0.360000")  # 0.30 + 0.06
    assert first.first_token_ms is not None and first.total_ms >= first.first_token_ms
    assert (session.input_tokens, session.output_tokens, session.cost) == (
        3000,
        600,
        Decimal("0.810000"),
    )
    usage = events(session, "turn.finished")[-1].data["usage"]
    assert usage == {"input_tokens": 3000, "output_tokens": 600, "cost": "0.810000"}


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_tokens_are_estimated_when_the_provider_reports_none(
    openai_server, anthropic_server, make_endpoint, make_agent, owner, api
):
    server = openai_server if api == "openai" else anthropic_server
    endpoint = make_endpoint(
        server, price_input_per_1k=Decimal("1"), price_output_per_1k=Decimal("2")
    )
    session = new_session(make_agent(endpoint, system_prompt="Be brief."), owner)
    answer = "An answer of a known length for the estimate."
    server.script(Reply(text=answer, usage=None))
    session = run_turn(session, "how long is this?")

    (row,) = calls(session)
    assert row.tokens_estimated is True
    # Counted with the endpoint's tokenizer: its api's default (anthropic: at least one
    # token per 3.5 ASCII characters, above o200k_base's count of this sentence).
    counter = endpoint_tokenizer(endpoint)
    assert row.output_tokens == count_tokens(answer, counter)
    if api == "anthropic":
        assert row.output_tokens == math.ceil(len(answer) / 3.5) > count_tokens(answer)
    else:
        assert row.output_tokens == count_tokens(answer)
    assert row.input_tokens >= count_tokens("Be brief.", counter) + count_tokens(
        "how long is this?", counter
    )
    assert row.cost == (Decimal(row.input_tokens) * 1 + Decimal(row.output_tokens) * 2) / 1000


# Tool-layer feedback -------------------------------------------------------------------


def test_unknown_tools_and_broken_arguments_go_back_to_the_model(
    openai_server, make_endpoint, make_agent, owner, lookup_tool
):
    session = new_session(make_agent(make_endpoint(openai_server), tools=["lookup"]), owner)
    openai_server.strict = False  # a model that calls a tool it was not offered
    openai_server.script(
        Reply(
            calls=[
                Call("delete_everything", {}),
                Call("lookup", '{"days": 7,,'),
                Call("lookup", {"days": 1}),
            ],
            interleave=True,
        ),
        Reply(text="Done, with what worked."),
    )
    session = run_turn(session)

    statuses = list(
        ToolCall.objects.filter(session=session)
        .order_by("position")
        .values_list("tool_name", "status")
    )
    assert statuses == [
        ("delete_everything", "rejected"),
        ("lookup", "failed"),
        ("lookup", "success"),
    ]
    shown = [m for m in openai_server.requests[1].messages if m["role"] == "tool"]
    assert "unknown tool 'delete_everything'. Tools you may use: lookup." in shown[0]["content"]
    assert "arguments are not valid JSON" in shown[1]["content"]
    assert (
        "count" in shown[2]["content"]
        and "days" in shown[2]["content"]
        and "FAILED" not in shown[2]["content"]
    )
    assert assistant_texts(session)[-1] == "Done, with what worked."


def test_prompt_tools_giving_up_ends_the_turn_with_a_clear_answer(
    openai_server, make_endpoint, make_agent, owner, lookup_tool
):
    endpoint = make_endpoint(openai_server, api="prompt_tools")
    session = new_session(make_agent(endpoint, tools=["lookup"]), owner)
    openai_server.script(*[Reply(text='{"tool_calls": [{"name": "nonsense"}]}') for _ in range(3)])
    session = run_turn(session)
    assert session.state == "finished" and assistant_texts(session) == [GAVE_UP_ANSWER]
    assert len(openai_server.requests) == 3
    assert [c.outcome for c in calls(session)] == ["success"]


def test_prompt_tools_run_a_tool_and_answer(
    openai_server, make_endpoint, make_agent, owner, lookup_tool
):
    endpoint = make_endpoint(openai_server, api="prompt_tools")
    session = new_session(make_agent(endpoint, tools=["lookup"]), owner)
    openai_server.script(
        Reply(text="```json\n{'tool_calls': [{'name': 'lookup', 'arguments': {'days': 2,}}]}\n```"),
        lambda request: Reply(
            text=json.dumps(
                {"answer": "Found 2 orders." if "count" in str(request.last_tool_result()) else "?"}
            )
        ),
    )
    session = run_turn(session)
    assert assistant_texts(session)[-1] == "Found 2 orders."
    assert ToolCall.objects.get(session=session).input == {"days": 2}
    first = Message.objects.filter(session=session, role="assistant").order_by("seq")[0]
    assert [c["name"] for c in first.tool_calls] == ["lookup"]


# Secrets -------------------------------------------------------------------------------


def test_the_api_key_never_reaches_a_record_an_event_a_message_or_a_log(
    openai_server, anthropic_server, make_endpoint, make_agent, owner, monkeypatch, caplog
):
    secret = f"sk-live-{uuid.uuid4().hex}"
    monkeypatch.setenv(KEY_ENV, secret)
    caplog.set_level(logging.DEBUG)
    primary, fallback = make_endpoint(openai_server), make_endpoint(anthropic_server)
    session = new_session(make_agent(primary, fallback_model=fallback), owner)

    # Turn 1: a 500 that echoes the key, then a mid-stream error that echoes it.
    openai_server.script(Reply(status=500, echo_key=True))
    anthropic_server.script(Reply(text="a b c", error_event_at=3, echo_key=True))
    session = run_turn(session, "one")
    assert session.state == "finished"
    # Turn 2: a 429 that echoes it, then an overloaded 529 that echoes it.
    openai_server.script(Reply(status=429, echo_key=True, headers={"Retry-After": "0"}))
    anthropic_server.script(Reply(status=529, echo_key=True))
    session = run_turn(session, "two")
    # Turn 3: a 401 that echoes it (not retried: the busy message answers).
    openai_server.script(Reply(status=401, echo_key=True, error_message="Incorrect API key"))
    session = run_turn(session, "three")
    assert session.state == "finished" and assistant_texts(session)[-1] == BUSY
    assert events(session, "turn.finished")[-1].data["stop_reason"] == "model_refused"
    # Every failure was logged, once, naming the endpoint.
    failures = [
        r.getMessage() for r in caplog.records if r.getMessage().startswith("model call failed")
    ]
    assert len(failures) == 5 and all(
        f"endpoint={e.name} " in f
        for e, f in zip([primary, fallback, primary, fallback, primary], failures, strict=True)
    )

    # The providers did receive the key, in their own headers...
    assert {r.headers["authorization"] for r in openai_server.requests} == {f"Bearer {secret}"}
    assert {r.headers["x-api-key"] for r in anthropic_server.requests} == {secret}
    # ... and the failures were recorded, but the key is nowhere.
    errors = [c.error for c in calls(session)]
    assert len(errors) == 5 and all(errors)
    assert any("[redacted]" in e for e in errors)
    records = {
        "model calls": errors,
        "session": [session.last_error],
        "events": [json.dumps(e.data) for e in events(session)],
        "messages": [
            json.dumps([m.content, m.tool_calls, m.data])
            for m in Message.objects.filter(session=session)
        ],
        "transitions": list(
            Transition.objects.filter(session=session).values_list("reason", flat=True)
        ),
        "checkpoints": [json.dumps(c.context) for c in Checkpoint.objects.filter(session=session)],
        "logs": [r.getMessage() + str(r.exc_info or "") for r in caplog.records],
        "endpoints": [json.dumps(list(ModelEndpoint.objects.values()), default=str)],
    }
    leaks = {where: [t for t in texts if secret in t] for where, texts in records.items()}
    assert leaks == {where: [] for where in records}


def test_the_router_redacts_a_key_that_slipped_into_an_error(make_endpoint, monkeypatch):
    monkeypatch.setenv(KEY_ENV, "sk-slipped-through-123")
    error = ModelUnavailable("proxy said: bad key sk-slipped-through-123 (HTTP 502)")
    _scrub(error, endpoint_config(make_endpoint(None, api="openai")))
    assert str(error) == "proxy said: bad key [redacted] (HTTP 502)" and error.retryable


def test_what_a_provider_echoed_is_scrubbed_as_logs_are(make_endpoint, monkeypatch):
    """The key was redacted, but a password, an e-mail and a card number a provider echoed
    survived into the model call's error and the transition's reason."""
    monkeypatch.setenv(KEY_ENV, "sk-the-endpoints-own-key")
    error = ModelUnavailable(
        "upstream 502: password=hunter2-secret for ann@example.com, card 4111 1111 1111 1111,"
        " key sk-the-endpoints-own-key, order SO-1001"
    )
    _scrub(error, endpoint_config(make_endpoint(None, api="openai")))
    text = str(error)
    for secret in ("hunter2-secret", "ann@example.com", "4111 1111 1111 1111", "sk-the-endpoints"):
        assert secret not in text, text
    assert "upstream 502" in text and "order SO-1001" in text and error.retryable


def test_switching_to_anthropic_mid_turn_after_a_server_that_reuses_tool_ids(
    openai_server, anthropic_server, make_endpoint, make_agent, owner, lookup_tool
):
    # Some OpenAI-compatible servers number calls per response (call_0, call_0, ...);
    # Anthropic refuses a request whose tool_use ids repeat. The switch must still work.
    first, second = make_endpoint(openai_server), make_endpoint(anthropic_server)
    ToolFactory(
        name="switch_model",
        handler="tests.adapters.switch_model",
        parameters={
            "type": "object",
            "properties": {"agent": {"type": "string"}, "endpoint": {"type": "string"}},
        },
    )
    agent = make_agent(first, tools=["lookup", "switch_model"])
    session = new_session(agent, owner)
    openai_server.script(
        Reply(calls=[Call("lookup", {"days": 1}, id="call_0")]),
        Reply(
            calls=[
                Call("switch_model", {"agent": agent.slug, "endpoint": second.name}, id="call_0")
            ]
        ),
    )
    anthropic_server.script(Reply(text="Switched and answered."))

    session = run_turn(session)

    assert anthropic_server.invalid == []
    assert assistant_texts(session)[-1] == "Switched and answered." and session.state == "finished"
    uses = [
        b["id"]
        for m in anthropic_server.requests[0].messages
        for b in m["content"]
        if b["type"] == "tool_use"
    ]
    assert len(uses) == len(set(uses)) == 2
