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

import json
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from django.db import connection
from psycopg.types.json import Jsonb

from approvals.models import Approval
from record.models import Session, ToolCall, ToolCallStatus
from record.rows import Statement, row_reader


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


@lru_cache(maxsize=1)
def _cached_query() -> str:
    table = ToolCall._meta.db_table
    return (
        # SQL names from model metadata (constants); every value is a bound parameter.
        f"""SELECT e.output FROM "{table}" e
     WHERE e.session_id = %s AND e.status = 'success' AND e.tool_name = %s AND e.input = %s
     ORDER BY e.id DESC LIMIT 1"""  # nosec B608
    )


@dataclass(frozen=True)
class CachedPrefetched:
    """`cached_output_statement`'s answer as the commit that wrote `version` read it."""

    version: int
    turn: int
    tool_name: str
    arguments: Any
    output: Any


def cached_output_statement(session: Session, tool_name: str, arguments: Any) -> Statement:
    """The query, for a commit to run after its writes (`Step.then_read`): the commit that
    activates a node whose read-only call the next step will run reads its cached output
    in its own round trip, so that step sends none."""
    return _cached_query(), [session.pk, tool_name, Jsonb(arguments)]


def cached_output_keep(
    session: Session,
    version: int,
    tool_name: str,
    arguments: Any,
    rows: list[tuple[Any, ...]],
) -> None:
    session.cached_output_prefetched = CachedPrefetched(  # type: ignore[attr-defined]
        version, session.turn, tool_name, arguments, rows[0][0] if rows else None
    )


def _same(a: Any, b: Any) -> bool:
    """Equal as JSON values (True is not 1, as jsonb has it)."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def cached_output_read(session: Session, tool_name: str, arguments: Any) -> Any:
    """The output of the latest successful call of this tool with these arguments in the
    session (None if there is none): `open_calls`' `cached_output`, for a call not stored yet
    (a workflow node's read-only call that its node step runs itself).

    The answer the previous commit read (`cached_output_keep`) is used once, and only while
    the session object is still at that commit's version (and turn) and the call is the
    one it was read for: calls are written by step commits (each moves the version), so
    equal versions mean the same answer.
    """
    kept: CachedPrefetched | None = getattr(session, "cached_output_prefetched", None)
    session.cached_output_prefetched = None  # type: ignore[attr-defined]
    if (
        kept is not None
        and kept.version == session.version
        and kept.turn == session.turn
        and kept.tool_name == tool_name
        and _same(kept.arguments, arguments)
    ):
        return kept.output
    sql, params = cached_output_statement(session, tool_name, arguments)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    return row[0] if row else None


# --- A workflow's node step reads the calls its waiting nodes opened -----------------


@dataclass(frozen=True)
class Finished:
    """The calls a tool step's results' commit wrote, as that commit (at `version`) left them."""

    version: int
    turn: int
    calls: dict[str, ToolCall]


def finished_keep(session: Session, calls: list[ToolCall]) -> None:
    """Keep the calls a commit just wrote the results of (the session object is at that
    commit's version) for the node step that follows."""
    session.finished_calls = Finished(  # type: ignore[attr-defined]
        session.version, session.turn, {c.call_id: c for c in calls}
    )


@lru_cache(maxsize=1)
def _calls_query() -> str:
    return (
        # SQL names from model metadata (constants); every value is a bound parameter.
        f'SELECT {row_reader(ToolCall).select("c")} FROM "{ToolCall._meta.db_table}" c '
        "WHERE c.session_id = %s AND c.turn = %s AND c.call_id = ANY(%s) ORDER BY c.id"  # nosec B608
    )


def calls_by_id(session: Session, call_ids: list[str]) -> dict[str, ToolCall]:
    """This turn's calls with these ids, by id.

    The calls the results' commit before wrote (`finished_keep`) are used once, and only
    while the session object is still at that commit's version and they hold every id
    asked for: equal versions mean equal rows (`open_calls`). Otherwise one query.
    """
    kept: Finished | None = getattr(session, "finished_calls", None)
    session.finished_calls = None  # type: ignore[attr-defined]
    if (
        kept is not None
        and kept.version == session.version
        and kept.turn == session.turn
        and all(i in kept.calls for i in call_ids)
    ):
        return {i: kept.calls[i] for i in call_ids}
    reader = row_reader(ToolCall)
    with connection.cursor() as cursor:
        cursor.execute(_calls_query(), [session.pk, session.turn, list(call_ids)])
        return {call.call_id: call for call in map(reader.instance, cursor.fetchall())}
