"""apply_config sets an agent's peak hours and time zone and a tool's declared sla_rate and
quota (the environment layer); a wrong value changes nothing and names entry and field."""

from typing import Any

import pytest

from configuration.services import ConfigInvalid, config_apply
from record.models import Agent
from tools.models import Tool

pytestmark = pytest.mark.django_db

TOOL = {
    "name": "issue_coupon",
    "description": "Issue a coupon to the customer.",
    "kind": "python",
    "handler": "builtin.current_time",
}
DOCUMENT: dict[str, Any] = {
    "models": [{"name": "main", "api": "rules"}],
    "tools": [{**TOOL, "sla_rate": 0.95, "quota": {"calls": 5000, "per": "day"}}],
    "agents": [
        {
            "slug": "support",
            "model": "main",
            "tools": ["issue_coupon"],
            "peak_hours": ["10:00-12:00", "19:00-21:00"],
            "timezone": "Asia/Shanghai",
        }
    ],
}


def test_the_environment_fields_apply_and_can_be_cleared() -> None:
    config_apply(document=DOCUMENT)
    agent = Agent.objects.get(slug="support")
    assert agent.peak_hours == ["10:00-12:00", "19:00-21:00"]
    assert agent.timezone == "Asia/Shanghai"
    tool = Tool.objects.get(name="issue_coupon")
    assert tool.sla_rate == 0.95 and tool.quota == {"calls": 5000, "per": "day"}

    cleared = {
        **DOCUMENT,
        "tools": [{**TOOL, "sla_rate": None, "quota": {"calls": 10, "per": "minute"}}],
        "agents": [{**DOCUMENT["agents"][0], "peak_hours": [], "timezone": ""}],
    }
    config_apply(document=cleared)
    agent.refresh_from_db()
    tool.refresh_from_db()
    assert agent.peak_hours == [] and agent.timezone == ""
    assert tool.sla_rate is None and tool.quota == {"calls": 10, "per": "minute"}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"peak_hours": ["10:00-12:00", "25:00-26:00"]},
            "agents[0] (support).peak_hours[1]: '25:00-26:00' is not a window HH:MM-HH:MM",
        ),
        ({"peak_hours": ["12:00-12:00"]}, "agents[0] (support).peak_hours[0]: '12:00-12:00'"),
        ({"peak_hours": ["9-12"]}, "agents[0] (support).peak_hours[0]: '9-12' is not a window"),
        (
            {"peak_hours": "10:00-12:00"},
            "agents[0] (support).peak_hours: '10:00-12:00' is not of type 'array'",
        ),
        ({"peak_hours": [10]}, "agents[0] (support).peak_hours[0]: 10 is not of type 'string'"),
        (
            {"peak_hours": ["10:00-11:00"] * 30},
            "agents[0] (support).peak_hours: at most 24 windows",
        ),
        (
            {"timezone": "Mars/Olympus"},
            "agents[0] (support).timezone: unknown time zone 'Mars/Olympus'",
        ),
        ({"timezone": "../../etc/passwd"}, "agents[0] (support).timezone: unknown time zone"),
        ({"timezone": 8}, "agents[0] (support).timezone: 8 is not of type 'string'"),
    ],
)
def test_a_wrong_agent_field_changes_nothing_and_says_where(
    change: dict[str, Any], message: str
) -> None:
    document = {**DOCUMENT, "agents": [{**DOCUMENT["agents"][0], **change}]}
    with pytest.raises(ConfigInvalid) as error:
        config_apply(document=document)
    assert message in str(error.value), str(error.value)
    assert not Agent.objects.exists() and not Tool.objects.exists()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"sla_rate": 1.5}, "tools[0] (issue_coupon).sla_rate: 1.5 is greater than the maximum of 1"),
        ({"sla_rate": -0.1}, "tools[0] (issue_coupon).sla_rate: -0.1 is less than the minimum of 0"),
        ({"sla_rate": "95%"}, "tools[0] (issue_coupon).sla_rate: '95%' is not of type 'number', 'null'"),
        ({"quota": {"calls": 0, "per": "day"}}, "tools[0] (issue_coupon).quota.calls: 0 is less than the minimum of 1"),
        ({"quota": {"calls": 5, "per": "week"}}, "tools[0] (issue_coupon).quota.per: 'week' is not one of"),
        ({"quota": {"calls": 5}}, "tools[0] (issue_coupon).quota: 'per' is a required property"),
        ({"quota": {"calls": 5, "per": "day", "burst": 2}}, "tools[0] (issue_coupon).quota: Additional properties"),
        ({"quota": 5000}, "tools[0] (issue_coupon).quota: 5000 is not of type 'object'"),
    ],
)  # fmt: skip
def test_a_wrong_tool_field_changes_nothing_and_says_where(
    change: dict[str, Any], message: str
) -> None:
    document = {**DOCUMENT, "tools": [{**DOCUMENT["tools"][0], **change}]}
    with pytest.raises(ConfigInvalid) as error:
        config_apply(document=document)
    assert message in str(error.value), str(error.value)
    assert not Tool.objects.exists()
