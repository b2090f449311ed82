"""A per-owner tool rate limit holds across two worker processes (shared through Redis).

Twenty sessions of one owner each call a tool limited to 4 calls a minute, run by two
Celery workers at once: exactly 4 calls run; the others get `rate_limited` with the wait,
and every turn still finishes.
"""

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from billing.ratelimit import WINDOW_S
from record.models import ToolCall
from tests.e2e.support import api, create_session, post_message, turns_finished, wait_events
from tests.factories import AgentFactory, ModelEndpointFactory, ToolFactory, api_key_for
from tests.stack import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

SESSIONS = 20
LIMIT = 4
# The limiter counts in fixed windows (WINDOW_S, aligned to the clock): the 20 calls must
# all be gated in one, or the next window lets LIMIT more run (a CI run posted at a
# window's edge). Posting starts with at least this long left of the window, else once it
# has turned: the last call was gated 2-4 s after posting here, 10 s at worst on a loaded
# 2-core machine, so 30 s is three times that. Should they ever take longer, the check
# after the run says so instead of miscounting. (It costs ~7 s on average, 30 s at most.)
WINDOW_LEFT_S = 30.0


def _fresh_window(left_s: float) -> float:
    """The end of the limiter's window after waiting, if less than `left_s` is left of the
    current one, for the next to begin."""
    now = time.time()
    end = (now // WINDOW_S + 1) * WINDOW_S
    if end - now < left_s:
        time.sleep(end - now + 0.01)
        end += WINDOW_S
    return end


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
            window_end = _fresh_window(WINDOW_LEFT_S)
            posted = time.time()
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
    # Each call was gated before its result was written: all of them in the one window.
    gated_by = max(c.finished_at for c in calls).timestamp()
    assert gated_by < window_end, (
        f"the calls took {gated_by - posted:.1f} s to be gated, past the limiter's window "
        f"(WINDOW_LEFT_S = {WINDOW_LEFT_S} s is too short for this machine)"
    )
    ran = [c for c in calls if c.status == "success"]
    limited = [c for c in calls if c.status == "failed"]
    assert len(ran) == LIMIT, [(c.status, c.output) for c in calls]
    assert len(limited) == SESSIONS - LIMIT
    assert all(c.output["error"]["code"] == "rate_limited" for c in limited)
    # Each is told to come back once the window has turned, never "in 0 s".
    waits = [c.output["error"]["retry_after_s"] for c in limited]
    assert all(1 <= w <= int(window_end - posted) + 1 for w in waits), waits
    # Both processes took runs: the limit is shared, not per process.
    for name, log in logs.items():
        assert "run_session" in log and "succeeded" in log, f"{name} ran nothing"
