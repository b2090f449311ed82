"""The test harness's own promises (tests/conftest.py)."""

import pytest
from django.core.management.base import CommandError
from django.db import OperationalError
from django.test import TransactionTestCase

from tests import conftest


def _failing(times: int, message: str):
    calls = []

    def flush(self):
        calls.append(1)
        if len(calls) <= times:
            raise CommandError("Database couldn't be flushed.") from OperationalError(message)

    return flush, calls


def test_a_flush_chosen_as_a_deadlock_victim_is_tried_again(monkeypatch):
    flush, calls = _failing(2, "deadlock detected\nDETAIL: Process 1 waits for ...")
    monkeypatch.setattr(conftest, "_flush", flush)
    monkeypatch.setattr(conftest.time, "sleep", lambda s: None)
    TransactionTestCase._fixture_teardown(TransactionTestCase())
    assert len(calls) == 3


@pytest.mark.parametrize(
    ("times", "message"),
    [(1, "could not serialize access"), (conftest.FLUSH_ATTEMPTS, "deadlock detected")],
)
def test_another_flush_error_or_a_deadlock_every_time_still_fails(monkeypatch, times, message):
    flush, calls = _failing(times, message)
    monkeypatch.setattr(conftest, "_flush", flush)
    monkeypatch.setattr(conftest.time, "sleep", lambda s: None)
    with pytest.raises(CommandError):
        TransactionTestCase._fixture_teardown(TransactionTestCase())
    assert len(calls) == min(times, conftest.FLUSH_ATTEMPTS)
