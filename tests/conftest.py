import time
from collections.abc import Generator

import pytest
import redis
from django.conf import settings
from django.core.management.base import CommandError
from django.db import DatabaseError
from django.test import TransactionTestCase

from tests.event_shapes import payload_problems
from tests.stack import Stack, running_stack


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run the end-to-end tests last.

    The real worker they start lives until the end of the run; started earlier,
    it would take the runs that in-process tests enqueue (message_post wakes a
    worker on commit) and race them for their sessions' leases.
    """
    items.sort(key=lambda item: item.get_closest_marker("e2e") is not None)


_flush = TransactionTestCase._fixture_teardown
FLUSH_ATTEMPTS = 5


def _fixture_teardown_retrying_deadlocks(self: TransactionTestCase) -> None:
    """Empty the test database, again if PostgreSQL picked the flush as a deadlock's victim.

    The live stack outlives each test: work the test set off goes on after it returns
    (a turn's memory extraction, the sweeper, beat's tasks) and takes row locks on two
    tables while the flush's TRUNCATE takes every table's lock in its own order. Either
    may be chosen to fail; when it is the flush, it is tried again (a victim's
    transaction is rolled back whole, so a second TRUNCATE starts clean).
    """
    for attempt in range(1, FLUSH_ATTEMPTS + 1):
        try:
            return _flush(self)
        except CommandError as error:
            if attempt == FLUSH_ATTEMPTS or "deadlock detected" not in str(error.__cause__):
                raise
            time.sleep(0.2 * attempt)


TransactionTestCase._fixture_teardown = _fixture_teardown_retrying_deadlocks  # type: ignore[method-assign]


@pytest.fixture(scope="session")
def live_stack(django_db_setup, django_db_blocker) -> Stack:  # type: ignore[no-untyped-def]
    """daphne + a Celery worker + beat, all on the test database, for the whole run."""
    # Runs that earlier in-process tests enqueued point at sessions long gone;
    # the worker need not wade through them.
    client = redis.Redis.from_url(settings.REDIS_URL)
    queue = settings.CELERY_TASK_DEFAULT_QUEUE
    client.delete(queue, *(f"{queue}\x06\x16{p}" for p in range(1, 10)))  # and its priority lists
    client.close()
    with django_db_blocker.unblock(), running_stack() as stack:
        yield stack


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    """Every event a test wrote matches its payload type (sessions/events.py).

    Checked after the test body, while its database is still there; the engine
    itself never validates payloads (the step path stays cheap).
    """
    result = yield
    if "_django_db_helper" in getattr(item, "fixturenames", ()):
        from sessions.models import Event

        try:
            rows = list(Event.objects.values_list("session_id", "seq", "type", "data"))
        except DatabaseError:
            # The test left its transaction unusable on purpose; it checked its own outcome.
            return result
        problems = [
            f"event {session}#{seq} {type_}: {problem}"
            for session, seq, type_, data in rows
            for problem in payload_problems(type_, data)
        ]
        assert not problems, "events that do not match sessions/events.py:\n" + "\n".join(
            problems[:20]
        )
    return result
