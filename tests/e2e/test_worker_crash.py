"""A worker killed in the middle of a turn: the lease runs out, the sweeper requeues, another worker finishes."""

import os
import signal
import time

import pytest

from demo.models import Notification, Report
from record.models import Session, ToolCall
from record.states import RUNNABLE
from tests.demo_setup import DEMO_REQUEST, demo_install
from tests.e2e.support import (
    api,
    create_session,
    get_messages,
    post_message,
    set_model_options,
    turns_finished,
    wait_events,
)
from tests.factories import api_key_for
from tests.stack import running_stack

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_run_survives_a_killed_worker():
    demo_install()
    set_model_options("rules", latency_s=1.0)
    key = api_key_for("alice")
    # A stack of its own (and a queue of its own), so killing its worker leaves
    # the shared `live_stack` alone; a short lease makes the takeover quick.
    extra = {"SESSION_LEASE_S": "3", "CELERY_QUEUE": f"agentplatform-crash-{os.getpid()}"}
    with running_stack(extra_env=extra) as stack, api(stack, key) as client:

        def logs():
            return "\n".join(
                f"--- {name}\n{stack.log_tail(name, 30)}" for name in ("worker", "worker2", "beat")
            )

        session_id = create_session(client, "order-support")
        post_message(client, session_id, DEMO_REQUEST)
        # query_orders has run; the worker is now in its second (one-second) model call.
        wait_events(
            client,
            session_id,
            lambda events: any(e["type"] == "tool.finished" for e in events),
            20,
            logs,
        )
        victim = stack.procs["worker"]
        row = Session.objects.get(pk=session_id)
        assert row.state in RUNNABLE, row.state
        assert f":{victim.pid}:" in (row.lease_owner or ""), (row.lease_owner, victim.pid)

        killed_at = time.monotonic()
        stack.stop("worker", signal.SIGKILL)
        assert victim.poll() == -signal.SIGKILL
        stack.start_worker("worker2")
        events = wait_events(client, session_id, turns_finished(1), 40, logs)
        recovered_in = time.monotonic() - killed_at
        messages = get_messages(client, session_id)

    debug = f"{[(e['seq'], e['type']) for e in events]}\nrecovered in {recovered_in:.1f} s"
    assert events[-1]["type"] == "turn.finished", debug
    assert events[-1]["data"]["stop_reason"] == "answer", debug
    assert sum(e["type"] == "turn.finished" for e in events) == 1, debug
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1)), debug
    assert messages[-1]["role"] == "assistant"
    assert messages[-1]["content"].startswith("Done. I found 3 orders"), messages[-1]
    # No side effect twice, and no tool call left hanging.
    assert Notification.objects.count() == 3
    assert Report.objects.count() == 1
    statuses = list(ToolCall.objects.filter(session_id=session_id).values_list("status", flat=True))
    assert statuses == ["success"] * 5, statuses
    row = Session.objects.get(pk=session_id)
    assert row.state == "finished" and row.lease_owner is None, (row.state, row.lease_owner)
