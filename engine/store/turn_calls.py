"""The states of a turn's tool calls, for its outcome when the run does not hold them.

A run keeps the turn's calls from its own commits (run_cache.RunContext.turn_calls); a
turn that ends anywhere else (a cancel by a service, an operator's answer, a workflow's
end, a stop in the tool step) reads them here: one query on the index that leads with
(session, turn), and no contents.
"""

from collections.abc import Iterable

from django.db import connection

from record.events import CallCounts, call_counts
from record.models import Session, ToolCall


def turn_call_states(session: Session) -> dict[int, tuple[str, str]]:
    """Each call of the session's current turn, by id: (status, refusal) as stored."""
    with connection.cursor() as cursor:
        cursor.execute(
            # SQL names from model metadata (constants); every value is a bound parameter.
            f'SELECT id, status, refusal FROM "{ToolCall._meta.db_table}" '  # nosec B608
            "WHERE session_id = %s AND turn = %s",
            [session.pk, session.turn],
        )
        return {pk: (status, refusal) for pk, status, refusal in cursor.fetchall()}


def turn_calls_counted(session: Session, updating: Iterable[ToolCall] = ()) -> CallCounts:
    """The turn's calls by how they ended, counting `updating` (calls the caller's step
    writes, updated or inserted) as they will be once it commits."""
    states = turn_call_states(session)
    # A call the step inserts (a node step ran it itself) has no id yet.
    inserted: list[tuple[str, str]] = []
    for call in updating:
        if call.pk is None:
            inserted.append((call.status, call.refusal))
        else:
            states[call.pk] = (call.status, call.refusal)
    return call_counts([*states.values(), *inserted])
