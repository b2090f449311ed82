"""Waking a session's run on a worker, after the current transaction commits.

The task is looked up by name so that services need not import the Celery
edge; a lost broker message only delays the run until the sweeper finds it.
"""

import logging
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from uuid import UUID

from celery import current_app
from django.db import transaction

RUN_TASK = "sessions.tasks.run_session"

logger = logging.getLogger(__name__)

# The broker publish runs on a thread of its own, so a request (the 202 of a
# posted message) never waits for it: under load one publish took 263 ms while
# Redis and the producer pool were busy. The turn is already committed; if the
# publish is lost (a crash before it runs, Redis down), the sweeper enqueues the
# run. One thread keeps the publishes in commit order; the executor's exit hook
# sends what is queued when the process stops normally.
_sender = ThreadPoolExecutor(max_workers=1, thread_name_prefix="run-enqueue")


def _send(session_id: str) -> None:
    try:
        current_app.tasks[RUN_TASK].delay(session_id)
    except Exception:  # noqa: BLE001 - the sweeper re-enqueues a run nobody woke
        logger.warning("could not enqueue the run of session %s", session_id, exc_info=True)


def _submit(session_id: str) -> None:
    _sender.submit(_send, session_id)


def run_enqueue_on_commit(session_id: UUID | str) -> None:
    transaction.on_commit(partial(_submit, str(session_id)))


def run_enqueue(session_id: UUID | str) -> None:
    current_app.tasks[RUN_TASK].delay(str(session_id))


def run_enqueue_later(session_id: UUID | str, seconds: float) -> None:
    current_app.tasks[RUN_TASK].apply_async((str(session_id),), countdown=seconds)
