"""bench/sqlcount.py counts a prepared step batch as the statements it runs."""

import pytest

from bench.sqlcount import SqlCounter
from engine.store.commit import Step, step_commit
from record.states import Trigger

from ..factories import SessionFactory

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_prepared_step_is_counted_as_its_writes_and_rows() -> None:
    """The step's writes arrive as `EXECUTE name(...)`; each still counts as the
    INSERT or UPDATE it runs, with its rows, its table and its commit."""
    sessions = [SessionFactory(state="idle") for _ in range(2)]
    counter = SqlCounter()
    counter.install()
    try:
        # The second step only runs what the first prepared.
        for session in sessions:
            step_commit(Step(session=session, trigger=Trigger.USER_MESSAGE))
    finally:
        counter.uninstall()
    tally = counter.snapshot()
    # Each move: the session UPDATE, a state.changed event and a Transition.
    assert tally.by_verb["UPDATE"] == 2 and tally.by_verb["INSERT"] == 4, dict(tally.by_verb)
    assert tally.by_verb.get("EXECUTE", 0) == 0
    assert tally.rows_by_table["agent_sessions_transition"] == 2
    assert tally.rows_by_table["agent_sessions_event"] == 2
    assert tally.rows_written == 6 and tally.commits == 2
    assert tally.prepares <= 3  # none if this connection ran such a step before


def test_counting_happens_in_the_snapshot_not_in_the_execute() -> None:
    """The wrapper only records an execute; splitting and classifying its text
    waits for `snapshot`, so a benchmark that snapshots between its timed
    windows does not time the counter's own work."""
    from django.db import connection

    counter = SqlCounter()
    counter.install()
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1;\nSELECT 2")
        assert counter.tallies["engine"].statements == 0  # recorded, not yet counted
        tally = counter.snapshot()
    finally:
        counter.uninstall()
    assert tally.statements == 2 and tally.reads == 2 and tally.round_trips == 1
    assert counter.snapshot().statements == 2  # counted once
