# ruff: noqa: F811 - pytest fixtures imported by name and used as parameters
"""Model routing in a run: a simple turn to the small model, escalation to the agent's own model
in the same step when the small one's answer is an invalid tool call; each call's tier and why.

The small model is the fake OpenAI-compatible server (scripted), the agent's own the offline
rules model, so each answer shows who gave it.
"""

from typing import Any

import pytest

from engine import session_run
from record.models import Message, ModelCall, ModelEndpoint, Session
from sessions.selectors import agent_routing_figures
from sessions.services import message_post
from tests.factories import AgentFactory, ModelEndpointFactory, SessionFactory
from tests.fakes.fixtures import openai_server, unique  # noqa: F401
from tests.fakes.model_servers import Call, FakeModelServer, Reply
from tests.tools.conftest import fake_endpoint  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def routed(fake_endpoint: ModelEndpoint) -> Session:
    main = ModelEndpointFactory(name="rules", api="rules", options={})
    agent = AgentFactory(
        slug="router",
        model=main,
        rules=[{"answer": "main says: {{ user }}"}],
        routing={
            "small": fake_endpoint.name,
            "when": "length < 20 && !message.contains('refund')",
            "escalate_on": ["invalid_tool_call"],
        },
    )
    return SessionFactory(agent=agent)


def _turn(session: Session, content: str) -> tuple[str, list[Any]]:
    message_post(session=session, content=content)
    assert session_run(session_id=session.pk).stopped == "idle"
    answer = Message.objects.filter(session=session, role="assistant").latest("seq").content
    calls = list(
        ModelCall.objects.filter(session=session, purpose="step")
        .order_by("id")
        .values_list("step", "endpoint_name", "tier", "tier_reason")
    )
    return answer, calls


def test_a_simple_turn_goes_to_the_small_model(
    routed: Session,
    openai_server: FakeModelServer,
    fake_endpoint: ModelEndpoint,
) -> None:
    openai_server.script(Reply(text="small says hi"))
    answer, calls = _turn(routed, "hi there")

    assert answer == "small says hi"
    assert [(c[1], c[2]) for c in calls] == [(fake_endpoint.name, "small")]
    assert calls[0][3].startswith("when held: length < 20")


def test_a_turn_the_rule_does_not_match_stays_on_the_agents_model(
    routed: Session,
    openai_server: FakeModelServer,
) -> None:
    answer, calls = _turn(routed, "I want a refund")

    assert answer == "main says: I want a refund"
    assert [(c[1], c[2], c[3]) for c in calls] == [("rules", "main", "when did not hold")]
    assert openai_server.requests == []


def test_an_invalid_tool_call_from_the_small_model_escalates_in_the_same_step(
    routed: Session,
    openai_server: FakeModelServer,
    fake_endpoint: ModelEndpoint,
) -> None:
    openai_server.strict = False  # a small model that calls a tool it was not offered
    openai_server.script(Reply(calls=[Call("teleport", {"to": "mars"})]))
    answer, calls = _turn(routed, "hi there")

    assert answer == "main says: hi there"
    assert [(c[1], c[2]) for c in calls] == [(fake_endpoint.name, "small"), ("rules", "main")]
    assert calls[0][0] == calls[1][0]  # one step
    assert calls[1][3] == "escalated: invalid_tool_call: teleport"


def test_the_agents_routing_figures_show_the_share_and_the_saving(
    routed: Session,
    openai_server: FakeModelServer,
) -> None:
    ModelEndpoint.objects.filter(name="rules").update(price_input_per_1k=10, price_output_per_1k=10)
    openai_server.script(Reply(text="small says hi"))
    _turn(routed, "hi there")
    _turn(routed, "a refund, please")

    figures = agent_routing_figures(agent=routed.agent, days=30)

    assert (figures.turns, figures.small_turns, figures.escalated) == (2, 1, 0)
    assert figures.cost_main_only > figures.cost  # the small turn priced at the main model's rates


def test_a_rule_over_its_cost_limit_does_not_run_and_the_turn_stays_on_the_agents_model(
    routed: Session, openai_server: FakeModelServer, settings: Any
) -> None:
    settings.EXPRESSION_COST_LIMIT = 100  # the rule alone costs ~20: it compiles
    routed.agent.routing = {**routed.agent.routing, "when": "dialogue.slots.all(k, k != '')"}
    routed.agent.save(update_fields=["routing"])
    routed.dialogue_state = {"slots": {f"s{i}": i for i in range(200)}}
    routed.save(update_fields=["dialogue_state"])

    answer, calls = _turn(routed, "a question")

    assert answer == "main says: a question"
    assert calls[0][2] == "main"
    assert calls[0][3].startswith(
        "expression_limit: agent 'router', field 'routing.when': CEL expression"
    )
    assert openai_server.requests == []
