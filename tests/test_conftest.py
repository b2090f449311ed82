"""The test harness's own promises (tests/conftest.py)."""

import pytest
from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType
from django.db import OperationalError, connection
from django.test import TransactionTestCase

from tests import conftest
from tests.factories import AgentFactory, api_key_for


def _failing(times: int, message: str):
    calls = []

    def delete_rows(db_name):
        calls.append(db_name)
        if len(calls) <= times:
            raise OperationalError(message)

    return delete_rows, calls


def test_a_flush_chosen_as_a_deadlock_victim_is_tried_again(monkeypatch):
    delete_rows, calls = _failing(2, "deadlock detected\nDETAIL: Process 1 waits for ...")
    monkeypatch.setattr(conftest, "_delete_rows", delete_rows)
    monkeypatch.setattr(conftest.time, "sleep", lambda s: None)
    TransactionTestCase._fixture_teardown(TransactionTestCase())
    assert calls == ["default"] * 3


@pytest.mark.parametrize(
    ("times", "message"),
    [(1, "could not serialize access"), (conftest.FLUSH_ATTEMPTS, "deadlock detected")],
)
def test_another_flush_error_or_a_deadlock_every_time_still_fails(monkeypatch, times, message):
    delete_rows, calls = _failing(times, message)
    monkeypatch.setattr(conftest, "_delete_rows", delete_rows)
    monkeypatch.setattr(conftest.time, "sleep", lambda s: None)
    with pytest.raises(OperationalError):
        TransactionTestCase._fixture_teardown(TransactionTestCase())
    assert len(calls) == min(times, conftest.FLUSH_ATTEMPTS)


@pytest.mark.django_db(transaction=True)
def test_the_flush_empties_every_table_but_what_migrate_wrote():
    AgentFactory(slug="flushed")
    api_key_for("flushed-user", ("support",))
    permissions, content_types = Permission.objects.count(), ContentType.objects.count()
    assert permissions and content_types

    conftest._delete_rows("default")

    kept = conftest.KEPT_TABLES
    with connection.cursor() as cursor:
        counts = {}
        for table in connection.introspection.django_table_names(only_existing=True):
            cursor.execute(f"SELECT count(*) FROM {connection.ops.quote_name(table)}")
            counts[table] = cursor.fetchone()[0]
        cursor.execute("SELECT count(*) FROM django_migrations")
        migrations = cursor.fetchone()[0]
    assert {t: n for t, n in counts.items() if n and t not in kept} == {}
    assert migrations > 0
    assert (Permission.objects.count(), ContentType.objects.count()) == (
        permissions,
        content_types,
    )


class _Id(str):
    def child(self, name: str) -> "_Id":
        return _Id(f"{self}::{name}")


class _Item:
    def __init__(self, parent: str, name: str, nodeid: str | None = None) -> None:
        self.parent = type("Parent", (), {"id": _Id(parent)})()
        self.name = name
        self._id = _Id(nodeid or f"{parent}::{name}")

    @property
    def nodeid(self) -> str:
        return str(self._id)


def test_cases_sharing_a_node_id_take_their_names_into_it():
    module = "tests/e2e/test_x.py"
    items = [
        _Item(module, "test_op[GET /a/]", f"{module}::test_op"),
        _Item(module, "test_op[POST /a/]", f"{module}::test_op"),
        _Item(module, "test_other"),
    ]
    conftest._unique_node_ids(items)
    assert [i.nodeid for i in items] == [
        f"{module}::test_op[GET /a/]",
        f"{module}::test_op[POST /a/]",
        f"{module}::test_other",
    ]


def test_node_ids_still_shared_stop_the_run():
    items = [_Item("tests/test_x.py", "test_a"), _Item("tests/test_x.py", "test_a")]
    with pytest.raises(pytest.UsageError, match="share node ids"):
        conftest._unique_node_ids(items)


def test_a_tests_password_hash_is_verified_by_djangos_default_hasher():
    from django.contrib.auth.hashers import PBKDF2PasswordHasher, make_password

    encoded = make_password("pw-for-a-live-stack")
    assert encoded.startswith("pbkdf2_sha256$1000$"), encoded
    # What a live stack's process (default hashers) does with it.
    assert PBKDF2PasswordHasher().verify("pw-for-a-live-stack", encoded)
    assert not PBKDF2PasswordHasher().verify("another", encoded)


def test_a_flush_broken_by_a_row_the_live_stack_added_is_tried_again(monkeypatch):
    from django.db import IntegrityError

    calls = []

    def delete_rows(db_name):
        calls.append(db_name)
        if len(calls) == 1:
            raise IntegrityError(
                'update or delete on table "agent_sessions_modelendpoint" violates foreign key'
                ' constraint "x" on table "agent_sessions_modelcall"'
            )

    monkeypatch.setattr(conftest, "_delete_rows", delete_rows)
    monkeypatch.setattr(conftest.time, "sleep", lambda s: None)
    TransactionTestCase._fixture_teardown(TransactionTestCase())
    assert calls == ["default"] * 2
