import re
import time
from collections import Counter
from collections.abc import Generator
from pathlib import Path

import pytest
import redis
from django.conf import settings
from django.contrib.auth.hashers import (
    PBKDF2PasswordHasher,
    get_hashers,
    get_hashers_by_algorithm,
)
from django.db import DatabaseError, IntegrityError, OperationalError, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.test import TransactionTestCase

from tests import database_template
from tests.event_shapes import payload_problems
from tests.stack import LIVE_STACKS, Stack, running_stack

# A module whose every test is end-to-end (its `pytestmark` starts with the mark).
E2E_MODULE = re.compile(r"^pytestmark = \[?\s*pytest\.mark\.e2e\b", re.MULTILINE)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """A lane does not import the modules its `-m` leaves out whole.

    Each xdist worker collects everything before `-m` deselects: the in-process lane
    would import every e2e module (the fuzz test builds the whole OpenAPI schema at
    import) and the e2e lane every other one. Read as text, a module can only be left
    out when no test of it could be selected; anything else is collected as usual.
    """
    markexpr = config.getoption("markexpr", "")
    name = collection_path.name
    if markexpr not in ("e2e", "not e2e", "e2e and fast_paths") or not (
        name.startswith("test_") and name.endswith(".py")
    ):
        return None
    text = collection_path.read_text()
    if markexpr == "e2e" and "pytest.mark.e2e" not in text:
        return True
    if markexpr == "e2e and fast_paths" and "pytest.mark.fast_paths" not in text:
        return True
    if markexpr == "not e2e" and E2E_MODULE.search(text):
        return True
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run the end-to-end tests last.

    The real worker they start lives until the end of the run; started earlier,
    it would take the runs that in-process tests enqueue (message_post wakes a
    worker on commit) and race them for their sessions' leases.
    """
    items.sort(key=lambda item: item.get_closest_marker("e2e") is not None)
    _unique_node_ids(items)


def _unique_node_ids(items: list[pytest.Item]) -> None:
    """Give every test its own node id: pytest-xdist hands tests out by id.

    schemathesis names its cases by operation (`test_x[GET /api/v1/agents/]`) but gives
    them all the test function's node id, so xdist would run one of them and drop the
    rest without a word. Such an item takes its name into its id; an id still shared
    after that stops the run.
    """
    counts = Counter(item.nodeid for item in items)
    for item in items:
        if counts[item.nodeid] > 1 and item.name != item.nodeid.rpartition("::")[2]:
            # pytest 9 keeps the id structured (`_id`); earlier ones kept the string.
            if hasattr(item, "_id"):
                item._id = item.parent.id.child(item.name)
            else:
                item._nodeid = f"{item.nodeid.rpartition('::')[0]}::{item.name}"
    shared = [nodeid for nodeid, n in Counter(item.nodeid for item in items).items() if n > 1]
    if shared:
        raise pytest.UsageError(f"tests share node ids (xdist would drop them): {shared[:5]}")


FLUSH_ATTEMPTS = 5
# Written by migrate and read by the permission checks; a flush that kept them needs no
# post_migrate to write them again (Django's flush truncates them and recreates them, the
# most expensive part of its ~0.4 s).
KEPT_TABLES = frozenset({"django_migrations", "django_content_type", "auth_permission"})
_flush_sql: dict[str, str] = {}


def _flush_statements(connection: BaseDatabaseWrapper) -> str:
    """One DELETE per table of the project's models, but the ones migrate writes, in one string."""
    if connection.alias not in _flush_sql:
        tables = sorted(
            set(connection.introspection.django_table_names(only_existing=True)) - KEPT_TABLES
        )
        quote = connection.ops.quote_name
        _flush_sql[connection.alias] = ";".join(f"DELETE FROM {quote(t)}" for t in tables)
    return _flush_sql[connection.alias]


def _fixture_teardown_deleting_rows(self: TransactionTestCase) -> None:
    """Empty the test database's tables in one transaction, again if it lost a deadlock.

    Django's flush TRUNCATEs every table (new files for each table and index) and then
    runs post_migrate to write the content types and permissions back: ~0.4 s a test,
    a third of the suite. A DELETE of every row, content types and permissions kept,
    leaves the same rows behind in ~2 ms. The foreign keys are deferred, so the order
    of the DELETEs does not matter: they are checked at the commit, when every
    referencing table is empty too.

    The live stack outlives each test: work the test set off goes on after it returns
    (a turn's memory extraction, the sweeper, beat's tasks) and locks or references rows
    the DELETEs remove. When the flush loses (a deadlock's victim, or a foreign key a
    worker's new row broke) it is tried again: its transaction is rolled back whole.
    """
    for db_name in self._databases_names(include_mirrors=False):
        for attempt in range(1, FLUSH_ATTEMPTS + 1):
            try:
                _delete_rows(db_name)
                break
            except (OperationalError, IntegrityError) as error:
                if attempt == FLUSH_ATTEMPTS or not _lost_to_the_live_stack(error):
                    raise
                time.sleep(0.2 * attempt)


def _lost_to_the_live_stack(error: Exception) -> bool:
    """A deadlock, or a row the live stack committed meanwhile that references a deleted one.

    Without TRUNCATE's table locks a worker can insert a row (a model call of a run that
    outlived its test) after the DELETE of its table ran and before the DELETE of the row it
    references: the deferred foreign key then fails the flush's commit, and the flush's
    next attempt deletes that row too.
    """
    message = str(error)
    return "deadlock detected" in message or "violates foreign key constraint" in message


def _delete_rows(db_name: str) -> None:
    connection = connections[db_name]
    with transaction.atomic(using=db_name), connection.cursor() as cursor:
        cursor.execute(_flush_statements(connection))


TransactionTestCase._fixture_teardown = _fixture_teardown_deleting_rows  # type: ignore[method-assign]


class QuickPBKDF2PasswordHasher(PBKDF2PasswordHasher):
    """Django's own PBKDF2 with 1,000 rounds instead of 1,000,000 for the tests' users.

    A test's staff user costs ~0.35 s of CPU with the default rounds, most of an admin
    test. The hash keeps the `pbkdf2_sha256` name and carries its rounds, so a live
    stack's processes, which keep the default hashers, verify it as they would any other.
    """

    iterations = 1_000


@pytest.fixture(scope="session", autouse=True)
def quick_password_hashing() -> Generator[None, None, None]:
    original = settings.PASSWORD_HASHERS
    settings.PASSWORD_HASHERS = [
        f"{__name__}.QuickPBKDF2PasswordHasher",
        *(h for h in original if not h.endswith(".PBKDF2PasswordHasher")),
    ]
    get_hashers.cache_clear()
    get_hashers_by_algorithm.cache_clear()
    yield
    settings.PASSWORD_HASHERS = original
    get_hashers.cache_clear()
    get_hashers_by_algorithm.cache_clear()


@pytest.fixture(scope="session")
def django_db_setup(django_test_environment, django_db_blocker, django_db_modify_db_settings):  # type: ignore[no-untyped-def]
    """The run's test database, cloned from a migrated template (tests/database_template.py)."""
    with django_db_blocker.unblock():
        name = database_template.create()
    yield
    with django_db_blocker.unblock():
        database_template.drop(name)


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
        LIVE_STACKS.append(stack)
        try:
            yield stack
        finally:
            LIVE_STACKS.remove(stack)


@pytest.fixture(autouse=True)
def _settings_not_leaked() -> Generator[None, None, None]:
    """A test leaves Django's settings as it found them. An `@override_settings` beside the
    `settings` fixture in one test is undone out of order and leaves its values to every
    later test of the process (a budget test failed far away from the one that leaked)."""
    from django.conf import settings as django_settings

    before = django_settings._wrapped
    yield
    assert django_settings._wrapped is before, "this test left Django's settings overridden"


@pytest.fixture(autouse=True)
def _worker_queue_emptied(request: pytest.FixtureRequest) -> Generator[None, None, None]:
    """An in-process test's queued runs are taken out of its lane's worker queue after it.

    No worker takes them in the in-process lane (each xdist worker has a queue of its own,
    tests/pytest_env.py), so left behind they add up and read as queue pressure
    (billing/pressure.py): a later test's steps would be degraded to the cheaper model.
    Worker heartbeats and pacing a test published go too: a "sick" worker's report lives
    30 s and reads as worker pressure, which degrades the steps of the tests after it.
    The e2e lane's queues and heartbeats belong to its live workers and are left alone.
    """
    yield
    if request.node.get_closest_marker("e2e") is not None:
        return
    from billing import pressure
    from record import dispatch
    from runtime import health
    from tests.stack import broker_queue_lists

    try:
        dispatch._sender.submit(lambda: None).result(timeout=10)  # what it still had to send
        broker, lists = broker_queue_lists()
        broker.delete(*lists)
        beats = health._redis()
        names = [
            n.decode() if isinstance(n, bytes) else str(n)
            for n in beats.smembers(health._index_key())
        ]
        beats.delete(
            health._index_key(), health._pacing_key(), *(health._worker_key(n) for n in names)
        )
    except redis.RedisError:
        pass  # a test that stopped the broker on purpose: nothing was queued since
    pressure._queue_seen[:] = [0.0, 0.0]
    health.cache_reset()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    """Every event a test wrote matches its payload type (record/events.py).

    Checked after the test body, while its database is still there; the engine
    itself never validates payloads (the step path stays cheap).
    """
    result = yield
    if "_django_db_helper" in getattr(item, "fixturenames", ()):
        from record.models import Event

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
        assert not problems, "events that do not match record/events.py:\n" + "\n".join(
            problems[:20]
        )
    return result


@pytest.fixture(autouse=True)
def _rules_model_strict() -> Generator[None, None, None]:
    """No rule of the offline model called a tool its request did not offer (llm/rules.py's
    strict mode, on for the whole suite): the engine may have survived the refused call, the
    test must not pass because of it. A test of the strict mode itself empties the list."""
    from llm import rules

    rules.STRICT_VIOLATIONS.clear()
    yield
    found = list(rules.STRICT_VIOLATIONS)
    rules.STRICT_VIOLATIONS.clear()
    assert not found, f"the strict rules model was asked for unoffered calls: {found}"
