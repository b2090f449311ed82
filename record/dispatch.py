"""Waking a session's run on a worker, after the current transaction commits.

The task is sent by name (runtime/tasks.py) so that services need not import the
Celery edge; a lost broker message only delays the run until the sweeper finds it.

Runs carry a broker priority from the session's value (`run_priority`): the
Redis transport keeps one list per priority and a worker takes from the most
urgent non-empty one, so when runs queue up, higher-value sessions start first.
A run already prefetched by a worker is not overtaken.
"""

import logging
import math
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from uuid import UUID

from django.db import transaction

from observability import tracing
from runtime.tasks import task_send

RUN_TASK = "sessions.tasks.run_session"
# Redis broker priorities: 0 is taken first. Tasks sent without one (the beat's
# sweeps) sit at 0; runs use 1-9: value 1.0 (the default) is 5, each doubling of
# the value one step sooner, each halving one step later.
DEFAULT_RUN_PRIORITY = 5

logger = logging.getLogger(__name__)

# The broker publish runs on a thread of its own, so a request (the 202 of a
# posted message) never waits for it: under load one publish took 263 ms while
# Redis and the producer pool were busy. The turn is already committed; if the
# publish is lost (a crash before it runs, Redis down), the sweeper enqueues the
# run. One thread keeps the publishes in commit order; the executor's exit hook
# sends what is queued when the process stops normally.
_sender = ThreadPoolExecutor(max_workers=1, thread_name_prefix="run-enqueue")


def run_priority(value: float | None) -> int:
    """The broker priority of a session's run (1 = soonest .. 9) from its value."""
    if value is None:
        return DEFAULT_RUN_PRIORITY
    if value <= 0:
        return 9
    return min(9, max(1, DEFAULT_RUN_PRIORITY - round(math.log2(value))))


def _send(
    session_id: str,
    priority: int,
    headers: dict[str, str] | None = None,
    countdown: float | None = None,
) -> None:
    try:
        task_send(RUN_TASK, (session_id,), priority=priority, headers=headers, countdown=countdown)
    except Exception:  # noqa: BLE001 - the sweeper re-enqueues a run nobody woke
        logger.warning("could not enqueue the run of session %s", session_id, exc_info=True)


def _submit(
    session_id: str,
    priority: int,
    headers: dict[str, str] | None = None,
    countdown: float | None = None,
) -> None:
    _sender.submit(_send, session_id, priority, headers, countdown)


def run_enqueue_on_commit(
    session_id: UUID | str, value: float | None = None, after_s: float = 0.0
) -> None:
    """`after_s`: the run is for later (a decision's undo window), not for now."""
    # The trace context (the REST request's span, when traces are on) is taken here, in
    # the caller's thread: the publish runs on the sender thread, which has none.
    transaction.on_commit(
        partial(_submit, str(session_id), run_priority(value), tracing.carrier(), after_s or None)
    )


def run_enqueue(session_id: UUID | str, value: float | None = None) -> None:
    task_send(RUN_TASK, (str(session_id),), priority=run_priority(value))


def run_enqueue_later(session_id: UUID | str, seconds: float, value: float | None = None) -> None:
    task_send(RUN_TASK, (str(session_id),), countdown=seconds, priority=run_priority(value))


MEMORY_TASK = "sessions.tasks.keep_turn_memory"
SUMMARY_AHEAD_TASK = "sessions.tasks.summarise_ahead"


def _send_memory(session_id: str, turn: int) -> None:
    try:
        # Least urgent: keeping memory may wait behind every session's next step.
        task_send(MEMORY_TASK, (session_id, turn), priority=9)
    except Exception:  # noqa: BLE001 - a lost extraction loses a memory, never the turn
        logger.warning("could not enqueue the memory of session %s", session_id, exc_info=True)


def memory_enqueue_on_commit(session_id: UUID | str, turn: int) -> None:
    """After the turn's answer commits, keep its memory off the step's critical path."""
    transaction.on_commit(lambda: _sender.submit(_send_memory, str(session_id), turn))


def _send_summary_ahead(session_id: str) -> None:
    try:
        # Behind the runs' steps, ahead of memory: the summary is needed a few steps later.
        task_send(SUMMARY_AHEAD_TASK, (session_id,), priority=8)
    except Exception:  # noqa: BLE001 - a lost message costs an inline summary, never the turn
        logger.warning("could not enqueue the summary of session %s", session_id, exc_info=True)


def summary_ahead_enqueue_on_commit(session_id: UUID | str) -> None:
    """After the step commits, prepare the session's next summary off its critical path."""
    transaction.on_commit(lambda: _sender.submit(_send_summary_ahead, str(session_id)))
