"""apply_config sets budgets, rate limits, the cheaper tier and `critical`; wrong values change nothing."""

from decimal import Decimal

import pytest

from configuration.services import ConfigInvalid, config_apply
from record.models import Agent, ModelEndpoint
from tools.models import Tool

pytestmark = pytest.mark.django_db

DOCUMENT = {
    "models": [
        {
            "name": "main",
            "api": "rules",
            "rate_limit_calls_per_min": 30,
            "credits_per_1k_tokens": 2.5,
        },
        {"name": "small", "api": "rules", "rate_limit_tokens_per_min": 50000},
    ],
    "tools": [
        {
            "name": "refund",
            "description": "Refund an order.",
            "kind": "python",
            "handler": "builtin.current_time",
            "critical": True,
            "rate_limit_calls_per_min": 5,
        }
    ],
    "agents": [
        {
            "slug": "support",
            "model": "main",
            "cheap_model": "small",
            "degraded_max_tokens": 256,
            "tools": ["refund"],
            "budget_turn_tokens": 20000,
            "budget_day_cost": 1.25,
        }
    ],
}


def test_an_agents_other_models_left_out_of_the_file() -> None:
    """The cheap and summary models stay as they are unless named; the fallback and the
    candidate are the file's: left out, there is none."""
    named = {**DOCUMENT["agents"][0], "fallback_model": "small", "candidate_model": "small"}
    config_apply(document={**DOCUMENT, "agents": [named]})
    agent = Agent.objects.get(slug="support")
    assert agent.fallback_model.name == agent.candidate_model.name == "small"
    left_out = {k: v for k, v in DOCUMENT["agents"][0].items() if k != "cheap_model"}
    config_apply(document={**DOCUMENT, "agents": [left_out]})
    agent = Agent.objects.get(slug="support")
    assert agent.cheap_model.name == "small"
    assert agent.fallback_model is None and agent.candidate_model is None


def test_billing_fields_apply() -> None:
    config_apply(document=DOCUMENT)
    assert ModelEndpoint.objects.get(name="main").rate_limit_calls_per_min == 30
    assert ModelEndpoint.objects.get(name="small").rate_limit_tokens_per_min == 50000
    assert ModelEndpoint.objects.get(name="main").credits_per_1k_tokens == Decimal("2.5")
    assert ModelEndpoint.objects.get(name="small").credits_per_1k_tokens == 0
    tool = Tool.objects.get(name="refund")
    assert (tool.critical, tool.rate_limit_calls_per_min) == (True, 5)
    agent = Agent.objects.get(slug="support")
    assert agent.cheap_model.name == "small" and agent.degraded_max_tokens == 256
    assert agent.budget_turn_tokens == 20000 and agent.budget_session_tokens is None
    assert agent.budget_day_cost == Decimal("1.25")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"cheap_model": "nowhere"}, "agents[0] (support).cheap_model: unknown model 'nowhere'"),
        ({"budget_turn_tokens": -1}, "budget_turn_tokens"),
        ({"budget_day_cost": "lots"}, "budget_day_cost"),
    ],
)
def test_a_wrong_billing_field_changes_nothing_and_says_where(change, message) -> None:  # type: ignore[no-untyped-def]
    document = {**DOCUMENT, "agents": [{**DOCUMENT["agents"][0], **change}]}
    with pytest.raises(ConfigInvalid) as error:
        config_apply(document=document)
    assert message in str(error.value), str(error.value)
    assert not Agent.objects.exists() and not Tool.objects.exists()
