"""The world around a step (engine/model/surroundings.py): the peak hour in the agent's
time zone, the tools' recent health from the platform's own ToolCall rows (one query,
cached), their quota left, and the host's pressure."""

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.db.models import F
from django.test.utils import CaptureQueriesContext

from engine.model.surroundings import (
    cache_reset,
    peak_hour,
    surroundings,
    tools_health,
)
from record.models import Agent, ToolCall
from runtime import health
from tests.factories import SessionFactory, ToolFactory
from tools.execution import ToolSnapshot

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fresh() -> None:
    cache_reset()
    health.cache_reset()


def _calls(tool: str, *rows: tuple[str, int | None], **fields: Any) -> None:
    session = SessionFactory.create()
    ToolCall.objects.bulk_create(
        ToolCall(
            session=session, turn=1, step=1, position=i, call_id=f"c{i}", tool_name=tool,
            status=status, elapsed_ms=elapsed, idempotency_key=uuid.uuid4().hex, **fields,
        )
        for i, (status, elapsed) in enumerate(rows)
    )  # fmt: skip


def _snapshot(name: str, **fields: Any) -> ToolSnapshot:
    return ToolSnapshot.from_model(ToolFactory.build(name=name, **fields))


def test_a_tools_recent_success_rate_and_p50_come_from_its_calls(settings):
    settings.ENV_SLA_MIN_CALLS = 5
    _calls(
        "logistics",
        *[("success", 100)] * 6, ("success", 300), ("failed", 900), ("timeout", 5000),
        ("rejected", None), ("executing", None),  # never reached the service / not finished
    )  # fmt: skip
    _calls("logistics", ("success", 1), ("success", 1), cached=True)  # answered from the cache
    tools = {"logistics": _snapshot("logistics", sla_rate=0.95), "idle": _snapshot("idle")}

    world = surroundings(Agent(peak_hours=[]), tools)

    assert world.tools["logistics"] == {
        "success_rate": 0.778,  # 7 of 9
        "calls": 9,
        "p50_ms": 100,
        "sla_rate": 0.95,
        "breaker": "closed",
    }
    assert world.tools["idle"] == {"breaker": "closed"}
    assert world.below_sla == ["logistics"]
    assert world.is_peak_hour is None


def test_a_rate_under_the_sla_counts_only_over_enough_calls(settings):
    settings.ENV_SLA_MIN_CALLS = 5
    _calls("sms", ("failed", 10), ("failed", 10), ("success", 10), ("success", 10))
    tools = {"sms": _snapshot("sms", sla_rate=0.9)}
    assert surroundings(Agent(), tools).below_sla == []  # 4 calls: not enough to judge
    settings.ENV_SLA_MIN_CALLS = 4
    cache_reset()
    assert surroundings(Agent(), tools).below_sla == ["sms"]


def test_the_quota_left_counts_the_calls_sent_in_its_period(settings):
    settings.BILLING_TIME_ZONE = "UTC"
    _calls("coupon", ("success", 10))
    ToolCall.objects.filter(tool_name="coupon").update(  # yesterday's: another period
        created_at=F("created_at") - timedelta(days=1, hours=1)
    )
    _calls("coupon", ("success", 10), ("failed", 10), ("executing", None), ("rejected", None))
    tools = {
        "coupon": _snapshot("coupon", quota={"calls": 5, "per": "day"}),
        "tight": _snapshot("tight", quota={"calls": 1, "per": "minute"}),
    }
    _calls("tight", ("success", 10))

    world = surroundings(Agent(), tools)

    assert world.tools["coupon"]["quota_left"] == 2  # 3 sent today (the refused one was not)
    assert world.tools["coupon"]["quota"] == "5/day"
    assert world.tools["tight"]["quota_left"] == 0
    assert world.quota_out == ["tight"]


def test_the_tools_are_read_in_one_query_then_from_the_cache(settings):
    settings.ENV_TOOL_STATS_TTL_S = 60
    tools = {f"t{i}": _snapshot(f"t{i}", quota={"calls": 9, "per": "hour"}) for i in range(12)}
    with CaptureQueriesContext(connection) as first:
        tools_health(tools)
    assert len(first.captured_queries) == 1
    with CaptureQueriesContext(connection) as again:
        assert set(tools_health(tools)) == set(tools)
    assert len(again.captured_queries) == 0
    settings.ENV_TOOL_STATS_TTL_S = 0
    with CaptureQueriesContext(connection) as stale:
        tools_health(tools)
    assert len(stale.captured_queries) == 1


@pytest.mark.parametrize(
    ("zone", "utc", "peak"),
    [
        ("Asia/Shanghai", datetime(2026, 3, 2, 2, 30, tzinfo=UTC), True),  # 10:30 there
        ("Asia/Shanghai", datetime(2026, 3, 2, 4, 0, tzinfo=UTC), False),  # 12:00 there
        ("", datetime(2026, 3, 2, 10, 30, tzinfo=UTC), True),  # BILLING_TIME_ZONE (UTC)
        ("Mars/Olympus", datetime(2026, 3, 2, 10, 30, tzinfo=UTC), True),  # not a zone: UTC
        ("America/New_York", datetime(2026, 3, 2, 10, 30, tzinfo=UTC), False),  # 05:30 there
    ],
)
def test_the_peak_hour_is_the_agents_time_zones(settings, zone, utc, peak):
    settings.BILLING_TIME_ZONE = "UTC"
    agent = Agent(peak_hours=["10:00-12:00", "19:00-21:00"], timezone=zone)
    assert peak_hour(agent, utc) is peak
    assert peak_hour(Agent(peak_hours=[], timezone=zone), utc) is None


def test_the_environment_clock_may_be_shifted_for_a_rehearsal(settings):
    now = datetime.now(UTC)
    agent = Agent(
        peak_hours=[f"{(now - timedelta(hours=1)):%H:%M}-{(now + timedelta(hours=1)):%H:%M}"],
        timezone="UTC",
    )
    assert peak_hour(agent) is True
    settings.ENV_CLOCK_SHIFT_S = 3 * 3600
    assert peak_hour(agent) is False
