import pytest
import redis
from django.conf import settings

from tests.stack import Stack, running_stack


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run the end-to-end tests last.

    The real worker they start lives until the end of the run; started earlier,
    it would take the runs that in-process tests enqueue (message_post wakes a
    worker on commit) and race them for their sessions' leases.
    """
    items.sort(key=lambda item: item.get_closest_marker("e2e") is not None)


@pytest.fixture(scope="session")
def live_stack(django_db_setup, django_db_blocker) -> Stack:  # type: ignore[no-untyped-def]
    """daphne + a Celery worker + beat, all on the test database, for the whole run."""
    # Runs that earlier in-process tests enqueued point at sessions long gone;
    # the worker need not wade through them.
    client = redis.Redis.from_url(settings.REDIS_URL)
    client.delete(settings.CELERY_TASK_DEFAULT_QUEUE)
    client.close()
    with django_db_blocker.unblock(), running_stack() as stack:
        yield stack
