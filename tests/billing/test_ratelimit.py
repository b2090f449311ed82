"""The per-owner rate limiter on the real Redis, and a limited tool call in the engine."""

import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from billing.ratelimit import RateLimit, rate_limit_take, seconds_until_window_turns
from engine import session_run
from engine.gates.tool_limits import retry_after_whole_s
from record.models import Session, ToolCall
from sessions.services import message_post
from tests.factories import ToolFactory
from tests.sessions.conftest import make_agent, make_session, owner, rules_model  # noqa: F401


def _name() -> str:
    return f"t-{uuid.uuid4().hex[:8]}"


def test_calls_per_minute_hold_under_concurrency() -> None:
    name = _name()
    limit = RateLimit(calls_per_min=7)
    with ThreadPoolExecutor(max_workers=16) as pool:
        waits = list(
            pool.map(
                lambda _: rate_limit_take(kind="tool", name=name, owner_id=1, limit=limit),
                range(40),
            )
        )
    assert waits.count(None) == 7
    refused = [w for w in waits if w is not None]
    assert all(0 < w <= 60 for w in refused)


def test_owners_and_kinds_have_their_own_windows() -> None:
    name = _name()
    limit = RateLimit(calls_per_min=1)
    assert rate_limit_take(kind="tool", name=name, owner_id=1, limit=limit) is None
    assert rate_limit_take(kind="tool", name=name, owner_id=1, limit=limit) is not None
    assert rate_limit_take(kind="tool", name=name, owner_id=2, limit=limit) is None
    assert rate_limit_take(kind="model", name=name, owner_id=1, limit=limit) is None


def test_tokens_per_minute_count_what_calls_carry() -> None:
    name = _name()
    limit = RateLimit(tokens_per_min=1000)
    assert rate_limit_take(kind="model", name=name, owner_id=1, limit=limit, tokens=600) is None
    assert rate_limit_take(kind="model", name=name, owner_id=1, limit=limit, tokens=600) is not None
    # A refused call is not counted: a smaller one still fits.
    assert rate_limit_take(kind="model", name=name, owner_id=1, limit=limit, tokens=400) is None


def test_a_call_larger_than_the_whole_limit_runs_alone_in_an_empty_window() -> None:
    name = _name()
    limit = RateLimit(tokens_per_min=100)
    assert rate_limit_take(kind="model", name=name, owner_id=1, limit=limit, tokens=500) is None
    assert rate_limit_take(kind="model", name=name, owner_id=1, limit=limit, tokens=1) is not None


def test_no_limit_costs_nothing() -> None:
    assert rate_limit_take(kind="tool", name=_name(), owner_id=1, limit=RateLimit()) is None


@pytest.mark.django_db(transaction=True)
def test_a_rate_limited_tool_call_returns_rate_limited_with_the_wait(make_agent, make_session):  # noqa: F811
    tool = ToolFactory(name=f"limited_{uuid.uuid4().hex[:6]}", roles=[], rate_limit_calls_per_min=2)
    agent = make_agent(
        tools=[tool.name],
        max_iterations=4,
        rules=[
            {"when": {"last_tool": None}, "tool_calls": [{"tool": tool.name}] * 3},
            {"answer": "done"},
        ],
    )
    session = make_session(agent=agent)
    message_post(session=session, content="go")
    started = time.monotonic()
    assert session_run(session_id=session.pk).stopped == "idle"
    assert time.monotonic() - started < 20

    calls = list(ToolCall.objects.filter(session=session).order_by("position"))
    assert [c.status for c in calls] == ["success", "success", "failed"]
    limited = calls[2].output["error"]
    assert limited["code"] == "rate_limited" and 1 <= limited["retry_after_s"] <= 60
    assert f"called again in {limited['retry_after_s']} s." in limited["message"]
    assert Session.objects.get(pk=session.pk).state == "finished"


def test_the_wait_is_rounded_up_to_the_window_turn_never_zero() -> None:
    """A call refused in a window's last moments is told to wait until it has turned:
    rounded up to the millisecond, at least 1 ms (rounded to the nearest, it was early)."""
    end = 120.0  # a window's end
    assert seconds_until_window_turns(end - 0.0004) == 0.001
    assert seconds_until_window_turns(end - 0.0014) == 0.002
    assert seconds_until_window_turns(end - 0.0014) >= 0.0014
    assert seconds_until_window_turns(end - 59.9995) == 60.0
    assert seconds_until_window_turns(end) == 60.0  # the next window has begun
    for now in (end - 0.0499, end - 0.0001, end - 37.25):
        assert now + seconds_until_window_turns(now) >= end


def test_a_limited_tool_call_is_told_whole_seconds_rounded_up() -> None:
    """What the model (and the call's output) is told: never "again in 0 s"."""
    assert retry_after_whole_s(0.001) == 1
    assert retry_after_whole_s(0.04) == 1
    assert retry_after_whole_s(0.6) == 1
    assert retry_after_whole_s(1.0) == 1
    assert retry_after_whole_s(1.2) == 2
    assert retry_after_whole_s(59.9) == 60
