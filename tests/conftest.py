import pytest

from tests.stack import Stack, running_stack


@pytest.fixture(scope="session")
def live_stack(django_db_setup, django_db_blocker) -> Stack:  # type: ignore[no-untyped-def]
    """daphne + a Celery worker + beat, all on the test database, for the whole run."""
    with django_db_blocker.unblock(), running_stack() as stack:
        yield stack
