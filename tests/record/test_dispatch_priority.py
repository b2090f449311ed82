"""Runs queued in the broker start highest session value first, on a real worker.

Six sessions of one agent (the instant `rules` model) get a message while no worker
listens; then one Celery worker with one thread (prefetch 1) starts on the run's
queue and takes them one at a time: the order their answers commit in is the order
the worker took their runs. Not an e2e test: it must run before the session's live
stack starts a worker of its own on the same queue (tests/conftest.py sorts e2e last).
"""

import json
import os
import time

import pytest
import redis
from django.conf import settings

from record import dispatch
from record.models import Session, Transition
from sessions.services import message_post, sessions_sweep
from tests.factories import AgentFactory, SessionFactory
from tests.stack import Stack, free_port
from tests.stack import test_database_url as database_url

pytestmark = pytest.mark.django_db(transaction=True)

VALUES = [1.0, 0.25, 8.0, 2.0, 0.5, 32.0]


def _clear_queue() -> None:
    """Runs earlier in-process tests enqueued (no worker took them) must not go first."""
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    queue = settings.CELERY_TASK_DEFAULT_QUEUE
    client.delete(queue, *(f"{queue}\x06\x16{p}" for p in range(1, 10)))
    client.close()


def test_a_free_worker_takes_the_highest_value_session_first() -> None:
    _clear_queue()
    agent = AgentFactory()
    sessions = [SessionFactory(agent=agent, value=value) for value in VALUES]
    for session in sessions:
        message_post(session=session, content="hello")
    dispatch._sender.submit(lambda: None).result(5)  # every run is in the broker

    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "REDIS_URL": settings.REDIS_URL,
        "CELERY_QUEUE": settings.CELERY_TASK_DEFAULT_QUEUE,
        "PYTHONUNBUFFERED": "1",
    }
    stack = Stack(port=free_port(), env=env)
    try:
        stack.start_worker("prio-worker", concurrency=1)
        deadline = time.monotonic() + 60
        ids = [s.pk for s in sessions]
        while Session.objects.filter(pk__in=ids, state="finished").count() < len(ids):
            assert time.monotonic() < deadline, stack.log_tail("prio-worker")
            time.sleep(0.2)
    finally:
        stack.stop("prio-worker")

    # The answer is each turn's last transition; one thread commits them one after another.
    last = {
        t.session_id: t.id
        for t in Transition.objects.filter(session_id__in=ids, to_state="finished").order_by("id")
    }
    order = sorted(sessions, key=lambda s: last[s.pk])
    assert [s.value for s in order] == sorted(VALUES, reverse=True)


def _queued_in_take_order() -> list[str]:
    """Session ids of the queued runs, in the order a worker would take them."""
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    queue = settings.CELERY_TASK_DEFAULT_QUEUE
    ids = []
    for name in [queue, *(f"{queue}\x06\x16{p}" for p in range(1, 10))]:
        for raw in reversed(client.lrange(name, 0, -1)):  # LPUSH in, BRPOP out
            ids.append(json.loads(raw)["headers"]["argsrepr"].strip("(),'"))
    client.close()
    return ids


def test_the_sweeper_requeues_runnable_sessions_highest_value_first() -> None:
    agent = AgentFactory()
    # 1.2 and 1.0 share a priority list: within it the sweeper's send order decides.
    values = [1.0, 4.0, 1.2, 0.5]
    sessions = [SessionFactory(agent=agent, value=value) for value in values]
    for session in sessions:
        message_post(session=session, content="hello")
    dispatch._sender.submit(lambda: None).result(5)
    _clear_queue()  # as if those wake-ups were lost
    Session.objects.filter(pk__in=[s.pk for s in sessions]).update(
        lease_owner=None, lease_expires_at=None
    )

    sessions_sweep()

    by_id = {str(s.pk): s.value for s in sessions}
    assert [by_id[i] for i in _queued_in_take_order() if i in by_id] == [4.0, 1.2, 1.0, 0.5]
