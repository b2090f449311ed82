"""A client's settings for a turn's model calls (Message.turn_options): sampling parameters
and the answer's JSON form reach every model call of the turn, a worker's crash between
steps included; a JSON answer is checked and repaired once, or the turn ends invalid_output.
The client's own tools: a call of one never runs here, the turn waits for its result.
"""

import time
import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone

from engine import client_results, session_run
from engine.moves.ask_user import CLIENT_DEADLINE_ERROR
from engine.phases.model import model_step
from engine.runner.lease import lease_acquire
from llm.types import ModelOptions
from record.errors import Conflict
from record.models import Agent, Event, Message, ModelCall, ModelEndpoint, Session, ToolCall
from sessions.services import message_post, questions_expire_due
from tests.factories import AgentFactory, ModelEndpointFactory, SessionFactory, ToolFactory
from tests.fakes.fixtures import anthropic_server  # noqa: F401
from tests.fakes.model_servers import Call, FakeModelServer, Reply

pytestmark = pytest.mark.django_db(transaction=True)

CITY = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
    "additionalProperties": False,
}
OPTIONS: ModelOptions = {
    "temperature": 0.3,
    "top_p": 0.9,
    "max_tokens": 500,
    "stop": ["END"],
    "seed": 7,
    "response_format": {"schema": CITY, "name": "City", "strict": True},
}


def _run(session: Session) -> Session:
    result = session_run(session_id=session.pk)
    assert result.stopped == "idle", result
    return Session.objects.get(pk=session.pk)


def _answer(session: Session) -> Message:
    message = Message.objects.filter(session=session, role="assistant").order_by("-seq").first()
    assert message is not None
    return message


def _finished(session: Session) -> dict[str, Any]:
    event = Event.objects.filter(session=session, type="turn.finished").order_by("-seq").first()
    assert event is not None
    return dict(event.data)


def test_the_options_reach_every_model_call_of_the_turn_across_a_crash(
    make_agent: Any, make_session: Any, fake_endpoint: ModelEndpoint, openai_server: FakeModelServer
) -> None:
    """The first step asks for a tool and its worker dies; the worker that takes over reads
    the options from the turn's message, not from anything the first one kept."""
    ModelEndpoint.objects.filter(pk=fake_endpoint.pk).update(options={"max_tokens": 200})
    tool = ToolFactory(
        name=f"clock_{uuid.uuid4().hex[:6]}",
        handler="builtin.current_time",
        parameters={"type": "object", "properties": {}},
    )
    session = make_session(make_agent(tools=[tool.name]))
    openai_server.script(Reply(calls=[Call(tool.name, {})]), Reply(text='{"city": "Paris"}'))
    message_post(session=session, content="where?", turn_options=OPTIONS)
    crashed = "crashed-worker:1:1:dead"
    assert lease_acquire(session_id=session.pk, owner=crashed, seconds=30)
    model_step(Session.objects.get(pk=session.pk), crashed)
    Session.objects.filter(pk=session.pk).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    session = _run(session)
    first, last = openai_server.wait_requests(2)
    for recorded in (first, last):
        body = recorded.body
        assert (body["temperature"], body["top_p"], body["stop"], body["seed"]) == (
            0.3,
            0.9,
            ["END"],
            7,
        )
        assert body["max_tokens"] == 200  # the client's 500, within the endpoint's own 200
        assert body["response_format"] == {
            "type": "json_schema",
            "json_schema": {"name": "City", "schema": CITY, "strict": True},
        }
        # The answer's form is told in words too: tool calls before it stay free.
        assert '"city"' in recorded.text() and "final answer" in recorded.text()
    assert (session.state, _answer(session).content) == ("finished", '{"city": "Paris"}')
    assert _finished(session)["stop_reason"] == "answer"


def test_json_object_is_sent_as_such_and_without_options_nothing_is_sent(
    make_agent: Any, make_session: Any, openai_server: FakeModelServer
) -> None:
    agent = make_agent()
    openai_server.script(Reply(text='{"a": 1}'), Reply(text="plain"))
    options: ModelOptions = {"response_format": {"schema": None, "name": "answer", "strict": False}}
    message_post(session=make_session(agent), content="json please", turn_options=options)
    _run(Session.objects.get(agent=agent))
    message_post(session=make_session(agent), content="hi")
    _run(Session.objects.filter(agent=agent).order_by("-created_at").first())  # type: ignore[arg-type]
    with_format, without = openai_server.wait_requests(2)
    assert with_format.body["response_format"] == {"type": "json_object"}
    assert "JSON object" in with_format.text()
    for name in ("response_format", "temperature", "top_p", "stop", "seed", "max_tokens"):
        assert name not in without.body


def _rules_agent(rules: list[dict[str, Any]]) -> Agent:
    agent: Agent = AgentFactory(
        slug=f"json-{uuid.uuid4().hex[:8]}",
        model=ModelEndpointFactory(name=f"rules-{uuid.uuid4().hex[:6]}", api="rules", options={}),
        rules=rules,
    )
    return agent


def _session_of(agent: Agent) -> Session:
    session: Session = SessionFactory(agent=agent)
    return session


def test_a_valid_json_answer_stands_and_a_fenced_one_is_unwrapped() -> None:
    agent = _rules_agent([{"answer": '```json\n{"city": "{{ user }}"}\n```'}])
    session = _session_of(agent)
    message_post(session=session, content="Oslo", turn_options=OPTIONS)
    session = _run(session)
    assert _answer(session).content == '{"city": "Oslo"}'
    assert ModelCall.objects.filter(session=session).count() == 1


def test_an_invalid_answer_is_repaired_once_in_the_same_step() -> None:
    agent = _rules_agent(
        [
            {"when": {"user": "^That answer is not valid: \\(top\\): 'city' is a required"},
             "answer": '{"city": "Rome"}'},
            {"answer": '{"town": "Rome"}'},
        ]
    )  # fmt: skip
    session = _session_of(agent)
    message_post(session=session, content="where?", turn_options=OPTIONS)
    session = _run(session)
    assert _answer(session).content == '{"city": "Rome"}'
    assert _finished(session)["stop_reason"] == "answer"
    assert ModelCall.objects.filter(session=session).count() == 2


def test_an_answer_still_invalid_after_the_repair_ends_the_turn_invalid_output() -> None:
    agent = _rules_agent([{"answer": "Rome, I think."}])
    session = _session_of(agent)
    message_post(session=session, content="where?", turn_options=OPTIONS)
    session = _run(session)
    assert _finished(session)["stop_reason"] == "invalid_output"
    assert session.state == "finished"
    assert session.last_error.startswith("invalid_json: not JSON")
    assert _answer(session).content == "Rome, I think."  # what the model said, for the operator
    assert ModelCall.objects.filter(session=session).count() == 2


# The client's own tools ---------------------------------------------------------------

WEATHER: ModelOptions = {
    "tools": [
        {
            "name": "send_refund",  # what a platform tool might do: here only the client's
            "description": "The client's own.",
            "parameters": {"type": "object", "properties": {"amount": {"type": "integer"}}},
        }
    ]
}


def _client_tool_session() -> Session:
    agent = _rules_agent(
        [
            {"when": {"user": "refund", "last_tool": None},
             "tool_calls": [{"tool": "send_refund", "args": {"amount": 5}}]},
            {"when": {"last_tool": "send_refund"}, "answer": "Refund: {{ result }}"},
        ]
    )  # fmt: skip
    session = _session_of(agent)
    message_post(session=session, content="refund me", turn_options=WEATHER)
    return _run(session)


def test_a_call_of_the_clients_tool_never_runs_here_and_the_turn_waits_without_a_worker() -> None:
    session = _client_tool_session()
    assert session.state == "paused_for_user" and session.timer_due_at is not None
    call = ToolCall.objects.get(session=session)
    assert (call.client, call.status, call.output, call.dispatched_at) == (
        True,
        "executing",
        None,
        None,
    )
    assert not Event.objects.filter(session=session, type="tool.finished").exists()
    waiting = Event.objects.get(session=session, type="progress", data__stage="client_tools")
    assert waiting.data["calls"] == [
        {"call_id": call.call_id, "tool": "send_refund", "input": {"amount": 5}}
    ]
    # A user message is no answer to it.
    with pytest.raises(Conflict) as refused:
        message_post(session=session, content="hello?")
    assert refused.value.code == "client_tools_pending"
    # The client's result: the same turn goes on.
    with transaction.atomic():
        locked = Session.objects.select_for_update().get(pk=session.pk)
        client_results(session=locked, calls=[call], results={call.call_id: "done"}, by="client")
    session = _run(session)
    assert (session.state, session.turn, _answer(session).content) == (
        "finished",
        1,
        "Refund: done",
    )


def test_an_abandoned_turn_ends_expired_past_the_deadline_without_calling_the_model(
    settings: Any,
) -> None:
    settings.OPENAI_CLIENT_TOOLS_WAIT_S = 0.2
    session = _client_tool_session()
    models_before = ModelCall.objects.filter(session=session).count()
    assert questions_expire_due() == []  # not yet due
    time.sleep(0.3)

    assert questions_expire_due() == [str(session.pk)]

    session = Session.objects.get(pk=session.pk)
    assert (session.state, session.timer_due_at) == ("cancelled", None)
    # Nobody listens: no run is woken and the model is not called again.
    assert ModelCall.objects.filter(session=session).count() == models_before
    assert Message.objects.filter(session=session).order_by("-seq")[0].role == "tool"
    call = ToolCall.objects.get(session=session)
    assert (call.status, call.refusal, call.error) == ("rejected", "expired", CLIENT_DEADLINE_ERROR)
    finished = Event.objects.get(session=session, type="tool.finished").data
    assert (finished["status"], finished["refusal"]) == ("rejected", "expired")
    summary = _finished(session)
    assert (summary["stop_reason"], summary["outcome"]) == ("expired", "stopped")
    assert summary["calls"] == {"ok": 0, "failed": 0, "rejected": 0, "expired": 1, "unpaid": 0}
    assert session.last_turn_calls == summary["calls"]
    # The history stays well formed: the call has its result, and a new turn can start.
    assert Message.objects.get(session=session, role="tool").tool_call_id == call.call_id
    message_post(session=session, content="hello again")
    assert Session.objects.get(pk=session.pk).state == "processing"


@pytest.mark.parametrize(
    ("result", "error"),
    [
        ('{"error": "card declined"}', "card declined"),
        ('{"ok": false, "error": "order closed"}', "order closed"),
    ],
)
def test_a_result_of_the_clients_tool_that_reports_an_error_counts_as_failed(
    result: str, error: str
) -> None:
    session = _client_tool_session()
    call = ToolCall.objects.get(session=session)
    with transaction.atomic():
        locked = Session.objects.select_for_update().get(pk=session.pk)
        client_results(session=locked, calls=[call], results={call.call_id: result}, by="client")
    session = _run(session)

    call.refresh_from_db()
    assert (call.status, call.error, call.output) == ("failed", error, {"result": result})
    # The model reads the client's text as sent.
    assert _answer(session).content == f"Refund: {result}"
    finished = _finished(session)
    assert finished["calls"] == {"ok": 0, "failed": 1, "rejected": 0, "expired": 0, "unpaid": 0}
    assert finished["outcome"] == "tool_failures"


def test_a_plain_or_successful_result_of_the_clients_tool_counts_as_ok() -> None:
    session = _client_tool_session()
    call = ToolCall.objects.get(session=session)
    with transaction.atomic():
        locked = Session.objects.select_for_update().get(pk=session.pk)
        client_results(
            session=locked, calls=[call], results={call.call_id: '{"ok": true}'}, by="client"
        )
    session = _run(session)
    assert _finished(session)["calls"]["ok"] == 1
    assert _finished(session)["outcome"] == "ok"


# tool_choice and parallel_tool_calls --------------------------------------------------


def _clock(unique_name: str) -> str:
    tool = ToolFactory(
        name=unique_name,
        handler="builtin.current_time",
        parameters={"type": "object", "properties": {}},
    )
    return str(tool.name)


def test_a_forced_tool_choice_holds_until_the_turns_first_call_then_auto(
    make_agent: Any, make_session: Any, openai_server: FakeModelServer
) -> None:
    """`required` on the first step (the model must call), `auto` once it has (else the turn
    could never answer); parallel_tool_calls false on every step, in each wire's form."""
    clock = _clock(f"clock_{uuid.uuid4().hex[:6]}")
    session = make_session(make_agent(tools=[clock]))
    openai_server.script(Reply(calls=[Call(clock, {})]), Reply(text="It is noon."))
    options: ModelOptions = {"tool_choice": "required", "parallel_tool_calls": False}
    message_post(session=session, content="time?", turn_options=options)
    session = _run(session)

    first, second = openai_server.wait_requests(2)
    assert (first.body["tool_choice"], first.body["parallel_tool_calls"]) == ("required", False)
    assert (second.body["tool_choice"], second.body["parallel_tool_calls"]) == ("auto", False)
    assert _answer(session).content == "It is noon."


def test_a_named_tool_choice_and_none_reach_the_anthropic_wire(
    make_agent: Any,
    make_session: Any,
    anthropic_server: FakeModelServer,  # noqa: F811 - the fixture imported above
    monkeypatch: Any,
) -> None:
    monkeypatch.setenv("ANTHROPIC_TURN_KEY", "ak-test")
    endpoint = ModelEndpointFactory(
        name=f"fake-anthropic-{uuid.uuid4().hex[:6]}",
        api="anthropic",
        base_url=anthropic_server.base_url,
        model="claude-fake",
        api_key_env="ANTHROPIC_TURN_KEY",
    )
    clock = _clock(f"clock_{uuid.uuid4().hex[:6]}")
    agent = make_agent(tools=[clock], model=endpoint)
    anthropic_server.script(
        Reply(calls=[Call(clock, {})]), Reply(text="noon"), Reply(text="no tools then")
    )
    named: ModelOptions = {"tool_choice": clock, "parallel_tool_calls": False}
    message_post(session=make_session(agent), content="time?", turn_options=named)
    _run(Session.objects.get(agent=agent))
    message_post(session=make_session(agent), content="time?", turn_options={"tool_choice": "none"})
    _run(Session.objects.filter(agent=agent).order_by("-created_at").first())  # type: ignore[arg-type]

    forced, after, none = anthropic_server.wait_requests(3)
    assert forced.body["tool_choice"] == {
        "type": "tool",
        "name": clock,
        "disable_parallel_tool_use": True,
    }
    assert after.body["tool_choice"] == {"type": "auto", "disable_parallel_tool_use": True}
    assert none.body["tool_choice"] == {"type": "none"}
    assert [t["name"] for t in none.body["tools"]] == [clock]


def test_with_parallel_tool_calls_off_only_the_first_call_of_a_reply_runs() -> None:
    # A model that ignores the setting (the strict rules model would refuse to be one).
    agent = _rules_agent(
        [
            {"when": {"last_tool": None},
             "tool_calls": [{"tool": "send_refund", "args": {"amount": 1}},
                            {"tool": "send_refund", "args": {"amount": 2}}]},
        ]
    )  # fmt: skip
    ModelEndpoint.objects.filter(pk=agent.model_id).update(options={"strict": False})
    session = _session_of(agent)
    message_post(
        session=session, content="refund", turn_options={**WEATHER, "parallel_tool_calls": False}
    )
    session = _run(session)
    assert [c.input for c in ToolCall.objects.filter(session=session)] == [{"amount": 1}]
