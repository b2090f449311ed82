"""Waking a session's run on a worker, after the current transaction commits.

The task is looked up by name so that services need not import the Celery
edge; a lost broker message only delays the run until the sweeper finds it.
"""

from uuid import UUID

from celery import current_app

RUN_TASK = "sessions.tasks.run_session"


def run_enqueue_on_commit(session_id: UUID | str) -> None:
    current_app.tasks[RUN_TASK].delay_on_commit(str(session_id))


def run_enqueue(session_id: UUID | str) -> None:
    current_app.tasks[RUN_TASK].delay(str(session_id))


def run_enqueue_later(session_id: UUID | str, seconds: float) -> None:
    current_app.tasks[RUN_TASK].apply_async((str(session_id),), countdown=seconds)
