"""Routing's two rules on their own: degradation wins over the routed small model at every
level that picks a cheaper tier, and `escalate_on` escalates for exactly the reasons it lists.

(The routed turns themselves, against a scripted small model, are in test_routing.py.)
"""

import pytest

from billing.degradation import CACHED, CHEAPER, CRITICAL_ONLY, NORMAL
from engine.gates.budget import called_endpoint, degraded_tier
from engine.gates.routing import MAIN, SMALL, escalation, route
from llm.types import (
    ChatMessage,
    ChatRequest,
    ChatResponse,
    ResponseFormat,
    ToolCallRequest,
    ToolSpec,
)
from record.models import Agent
from tests.factories import AgentFactory, ModelEndpointFactory, SessionFactory


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("level", "expected"),
    [(NORMAL, "small"), (CHEAPER, "cheap"), (CACHED, "cheap"), (CRITICAL_ONLY, "cheap")],
)
def test_a_simple_turn_goes_to_the_degraded_tier_whenever_degradation_picks_one(
    level: int, expected: str
) -> None:
    main = ModelEndpointFactory(name="main", api="rules")
    ModelEndpointFactory(name="small", api="rules")
    cheap = ModelEndpointFactory(name="cheap", api="rules")
    agent = AgentFactory(
        slug="routed",
        model=main,
        cheap_model=cheap,
        routing={"small": "small", "when": "length < 50"},
    )
    session = SessionFactory(agent=agent)
    history = [ChatMessage(role="user", content="hi")]
    way = route(session, agent, history, degraded_tier(agent, level) is not None)
    endpoint, tier = called_endpoint(session, agent, level, way.endpoint)

    assert endpoint.name == expected
    assert way.tier == (SMALL if expected == "small" else MAIN)
    assert (tier is not None) == (expected == "cheap")


def _agent(escalate_on: list[str] | None) -> Agent:
    routing: dict = {"small": "small", "when": "true"}
    if escalate_on is not None:
        routing["escalate_on"] = escalate_on
    return Agent(slug="a", routing=routing)


OFFERED = ChatRequest(
    messages=(ChatMessage(role="user", content="hi"),),
    tools=(ToolSpec(name="lookup", description="", parameters={"type": "object"}),),
)
UNOFFERED_CALL = ChatResponse(tool_calls=[ToolCallRequest(id="c1", name="wipe", arguments={})])
BROKEN_ARGUMENTS = ChatResponse(
    tool_calls=[ToolCallRequest(id="c1", name="lookup", arguments={}, arguments_error="bad")]
)
JSON_ASKED = ChatRequest(
    messages=(ChatMessage(role="user", content="hi"),),
    response_format=ResponseFormat(schema={"type": "object"}),
)
NOT_JSON = ChatResponse(text="certainly! here it is")


@pytest.mark.parametrize(
    ("escalate_on", "request_", "response", "escalates"),
    [
        (["invalid_tool_call"], OFFERED, UNOFFERED_CALL, True),
        (["invalid_tool_call"], OFFERED, BROKEN_ARGUMENTS, True),
        (["invalid_json"], OFFERED, UNOFFERED_CALL, False),
        (["invalid_json"], JSON_ASKED, NOT_JSON, True),
        (["invalid_tool_call"], JSON_ASKED, NOT_JSON, False),
        ([], OFFERED, UNOFFERED_CALL, False),  # an empty list: never escalate
        ([], JSON_ASKED, NOT_JSON, False),
        (None, OFFERED, UNOFFERED_CALL, True),  # absent: both reasons
        (None, JSON_ASKED, NOT_JSON, True),
        (["invalid_json"], JSON_ASKED, ChatResponse(text='{"ok": true}'), False),
    ],
)
def test_escalate_on_escalates_for_the_reasons_it_lists_and_no_other(
    escalate_on: list[str] | None,
    request_: ChatRequest,
    response: ChatResponse,
    escalates: bool,
) -> None:
    assert bool(escalation(_agent(escalate_on), request_, response)) is escalates
