"""bench/sqlcount.py counts a prepared step batch as the statements it runs."""

import pytest

from bench.sqlcount import SqlCounter
from sessions.engine.commit import Step, step_commit
from sessions.states import Trigger

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
