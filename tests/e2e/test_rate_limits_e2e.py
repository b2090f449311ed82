"""A per-owner tool rate limit holds across two worker processes (shared through Redis).

Twenty sessions of one owner each call a tool limited to 4 calls a minute, run by two
Celery workers at once: exactly 4 calls run; the others get `rate_limited` with the wait,
and every turn still finishes.
"""

from concurrent.futures import ThreadPoolExecutor

import pytest

from sessions.models import ToolCall
from tests.e2e.support import api, create_session, post_message, turns_finished, wait_events
from tests.factories import AgentFactory, ModelEndpointFactory, ToolFactory, api_key_for
from tests.stack import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

SESSIONS = 20
LIMIT = 4


def test_a_tool_rate_limit_holds_across_two_worker_processes(live_stack: Stack) -> None:
    ToolFactory(
        name="limited_clock",
        handler="builtin.current_time",
        roles=[],
        rate_limit_calls_per_min=LIMIT,
    )
    AgentFactory(
        slug="rate-limited",
        model=ModelEndpointFactory(name="rules", api="rules", options={}),
        tools=["limited_clock"],
        rules=[
            {"when": {"last_tool": None}, "tool_calls": [{"tool": "limited_clock"}]},
            {"answer": "done"},
        ],
    )
    key = api_key_for("limited-owner")
    live_stack.start_worker("worker2")
    try:
        live_stack.wait_worker_ready("worker2")
        with api(live_stack, key) as client:
            ids = [create_session(client, "rate-limited") for _ in range(SESSIONS)]
            with ThreadPoolExecutor(max_workers=10) as pool:
                list(pool.map(lambda sid: post_message(client, sid, "what time is it?"), ids))
            for sid in ids:
                wait_events(client, sid, turns_finished(1), timeout=60)
        logs = {
            name: live_stack.logs[name].read_text(errors="replace")
            for name in ("worker", "worker2")
        }
    finally:
        live_stack.stop("worker2")

    calls = list(ToolCall.objects.filter(session_id__in=ids))
    assert len(calls) == SESSIONS
    ran = [c for c in calls if c.status == "success"]
    limited = [c for c in calls if c.status == "failed"]
    assert len(ran) == LIMIT, [(c.status, c.output) for c in calls]
    assert len(limited) == SESSIONS - LIMIT
    assert all(c.output["error"]["code"] == "rate_limited" for c in limited)
    # Both processes took runs: the limit is shared, not per process.
    for name, log in logs.items():
        assert "run_session" in log and "succeeded" in log, f"{name} ran nothing"
