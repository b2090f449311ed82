"""The open tool calls of a turn: what a tool step runs.

One query gives this turn's calls still executing, each with the output of
the latest earlier successful call of the same tool with the same arguments
in the session (`cached_output`; used for read-only tools only) and whether
a person was asked about it (`has_approval`).

The commit that opens the calls (the model step's tool intents) runs the same
query at the end of its batch (`Step.then_read`), in the same round trip and
transaction: it sees exactly the rows that commit wrote. The tool step that
follows takes those rows instead of reading them again, as long as the
session is still at the version that commit wrote; anything else (another
commit in between, a session re-read, a run that starts at `tool_wait`)
reads them.
"""

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from django.db import connection

from approvals.models import Approval
from sessions.models import Session, ToolCall, ToolCallStatus
from sessions.rows import Statement, row_reader


@lru_cache(maxsize=1)
def _query() -> str:
    """The query's text (once, lazily: the model's metadata is complete only once the
    app registry is)."""
    table = ToolCall._meta.db_table
    return (
        # SQL names from model metadata (constants); every value is a bound parameter.
        f"""SELECT {row_reader(ToolCall).select("c")}, (SELECT e.output FROM "{table}" e
                  WHERE e.session_id = c.session_id AND e.status = 'success'
                    AND e.tool_name = c.tool_name AND e.input = c.input AND e.id <> c.id
                  ORDER BY e.id DESC LIMIT 1) AS cached_output,
           EXISTS (SELECT 1 FROM "{Approval._meta.db_table}" a WHERE a.tool_call_id = c.id)
             AS has_approval
      FROM "{table}" c WHERE c.session_id = %s AND c.turn = %s AND c.status = %s
     ORDER BY c.step, c.position"""  # nosec B608
    )


@dataclass(frozen=True)
class Prefetched:
    """The open calls as the commit that wrote `version` left them."""

    version: int
    turn: int
    rows: list[tuple[Any, ...]]


def open_calls_statement(session: Session, turn: int) -> Statement:
    """The query, for a commit to run after its writes (`Step.then_read`)."""
    return _query(), [session.pk, turn, ToolCallStatus.EXECUTING.value]


def prefetched_keep(session: Session, version: int, turn: int, rows: list[tuple[Any, ...]]) -> None:
    """Keep the rows a commit's `then_read` returned for the session's next tool step."""
    session.open_calls_prefetched = Prefetched(version, turn, rows)  # type: ignore[attr-defined]


def _calls(rows: list[tuple[Any, ...]]) -> list[ToolCall]:
    reader = row_reader(ToolCall)
    calls = []
    for row in rows:
        call = reader.instance(row)
        call.cached_output, call.has_approval = row[-2], row[-1]
        calls.append(call)
    return calls


def open_calls(session: Session) -> list[ToolCall]:
    """This turn's calls still executing (with `cached_output` and `has_approval`), in order.

    The prefetched rows are used once, and only while the session object is
    still at the version (and turn) of the commit that read them. A turn's
    calls and their approvals are written by step commits (each moves the
    version) and, without a move, only by the tool step that took them (its
    dispatch marks, probe outcomes), after it took them: equal versions mean
    equal rows.
    """
    prefetched: Prefetched | None = getattr(session, "open_calls_prefetched", None)
    session.open_calls_prefetched = None  # type: ignore[attr-defined]
    if (
        prefetched is not None
        and prefetched.version == session.version
        and prefetched.turn == session.turn
    ):
        return _calls(prefetched.rows)
    sql, params = open_calls_statement(session, session.turn)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    return _calls(rows)
