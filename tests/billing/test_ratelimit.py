"""The per-owner rate limiter on the real Redis, and a limited tool call in the engine."""

import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from billing.ratelimit import RateLimit, rate_limit_take
from engine import session_run
from sessions.models import Session, ToolCall
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
    assert limited["code"] == "rate_limited" and 0 < limited["retry_after_s"] <= 60
    assert Session.objects.get(pk=session.pk).state == "finished"
