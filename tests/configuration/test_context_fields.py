"""apply_config sets an agent's context budget and summary model; wrong values change nothing."""

from typing import Any

import pytest

from configuration.services import ConfigInvalid, config_apply
from record.models import Agent

pytestmark = pytest.mark.django_db

DOCUMENT: dict[str, Any] = {
    "models": [{"name": "main", "api": "rules"}, {"name": "summariser", "api": "rules"}],
    "agents": [
        {
            "slug": "support",
            "model": "main",
            "context_window": 32000,
            "context_budget": {"history": 12000, "memory": 0.05, "summarise_at": 0.8},
            "summary_model": "summariser",
        }
    ],
}


def test_context_fields_apply_and_can_be_cleared() -> None:
    config_apply(document=DOCUMENT)
    agent = Agent.objects.get(slug="support")
    assert agent.context_budget == {"history": 12000, "memory": 0.05, "summarise_at": 0.8}
    assert agent.summary_model is not None and agent.summary_model.name == "summariser"

    cleared = {**DOCUMENT, "agents": [{**DOCUMENT["agents"][0], "summary_model": None}]}
    cleared["agents"][0]["context_budget"] = {}
    config_apply(document=cleared)
    agent.refresh_from_db()
    assert agent.summary_model is None and agent.context_budget == {}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"summary_model": "nowhere"},
            "agents[0] (support).summary_model: unknown model 'nowhere'",
        ),
        ({"context_budget": {"histroy": 1}}, "agents[0] (support).context_budget: unknown key"),
        ({"context_budget": {"trim_at": 2}}, "'trim_at' must be a share between 0 and 1"),
        ({"context_budget": [1]}, "context_budget"),
    ],
)
def test_a_wrong_context_field_changes_nothing_and_says_where(
    change: dict[str, Any], message: str
) -> None:
    document = {**DOCUMENT, "agents": [{**DOCUMENT["agents"][0], **change}]}
    with pytest.raises(ConfigInvalid) as error:
        config_apply(document=document)
    assert message in str(error.value), str(error.value)
    assert not Agent.objects.exists()
