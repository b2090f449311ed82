"""Leases: one worker runs a session at a time, and a dead worker's lease runs out.

A lease is the pair (lease_owner, lease_expires_at) on the session row, taken
and renewed with conditional UPDATEs against the database clock. While a run is
in flight a heartbeat thread renews, in one statement, the leases of this process
that no step commit renewed lately, so a short lease (fast takeover after a crash)
does not expire under a long model call.
"""

import logging
import os
import socket
import threading
import uuid
from uuid import UUID

from django.conf import settings
from django.db import connection

from approvals.states import UNDO_HOLD
from billing.pressure import owner_watch_note, owner_watch_sql
from engine.store.commit import GUARD, MARK_SET, STAMP_RETURNING
from memory.selectors import memory_owner_items_sql
from record.models import Message, MessageStatus, Session, ToolCall
from record.rows import execute_batch, row_reader
from record.states import RUNNABLE, STARTS_TURN

logger = logging.getLogger(__name__)

_TABLE = Session._meta.db_table
_RUNNABLE = [s.value for s in RUNNABLE]
# States a queued message can start a turn from.
_STARTS_TURN = [s.value for s in STARTS_TURN]


# Whether the session's current turn has tool calls yet: one probe of an index the
# returned row already points at (toolcall_session_turn), in the lease's own statement.
_TURN_HAS_CALLS = (
    # SQL names from model metadata (constants).
    f'EXISTS (SELECT 1 FROM "{ToolCall._meta.db_table}" c '  # nosec B608
    f"WHERE c.session_id = {_TABLE}.id AND c.turn = {_TABLE}.turn)"
)


def worker_identity() -> str:
    """A lease owner id unique to this run (process, thread and a random part)."""
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}:{uuid.uuid4().hex[:6]}"


# SQL names from model metadata (constants); every value is a bound parameter.
# Taking over a lease that lapsed in another owner's hands (a worker that died before the
# sweeper came by) is a crash recovery, as the sweeper's requeue is: `resume_check`. A
# decision's undo window (UNDO_HOLD) that closed is not.
_ACQUIRE = f"""UPDATE {_TABLE}
       SET lease_owner = %s, lease_expires_at = now() + make_interval(secs => %s),
           resume_check = resume_check
               OR (lease_owner IS NOT NULL AND lease_owner <> %s AND lease_owner <> '{UNDO_HOLD}')
     WHERE id = %s
       AND (lease_owner IS NULL OR lease_owner = %s OR lease_expires_at < now())
       AND (state = ANY(%s) OR (state = ANY(%s) AND queued_count > 0))"""  # nosec B608


def lease_acquire(*, session_id: UUID | str, owner: str, seconds: float) -> bool:
    """Take the lease if it is free, expired or already ours, and there is work."""
    with connection.cursor() as cursor:
        cursor.execute(
            _ACQUIRE, [owner, seconds, owner, session_id, owner, _RUNNABLE, _STARTS_TURN]
        )
        return cursor.rowcount == 1


# A conversation's history as a run's first model step reads it (run_cache.RunContext):
# read with the lease, only if the lease was taken (the UPDATE's mark) and the run is
# not a workflow's (its steps read no history).
_HISTORY = (
    # SQL names from model metadata (constants); every value is a bound parameter.
    f'SELECT {{columns}} FROM "{Message._meta.db_table}" m '  # nosec B608
    "WHERE m.session_id = %s AND m.status = %s AND m.archived_at IS NULL AND "
    f'{GUARD} AND NOT EXISTS (SELECT 1 FROM "{_TABLE}" s '
    "WHERE s.id = %s AND s.workflow_version_id IS NOT NULL) ORDER BY m.seq"
)
# What the run's first model step asks about the owner: has it memory items (the
# memory gate), budgets or a credit account (the budget gate). Its row says the reads
# of the batch ran in the lease's transaction.
_OWNER = (
    f"SELECT {memory_owner_items_sql('s.owner_id')}, {owner_watch_sql('s.owner_id')} "  # nosec B608
    f'FROM "{_TABLE}" s WHERE s.id = %s AND {GUARD}'
)


def lease_take(*, session_id: UUID | str, owner: str, seconds: float) -> Session | None:
    """`lease_acquire`, returning the session row as the lease took it (None if not
    taken) with its agent's configuration stamp: a run's first reads come back with its
    first write, in one round trip: the history its first model step reads and what that
    step asks about the owner (memory items, budgets) ride along, read only if the lease
    was taken."""
    reader = row_reader(Session)
    messages = row_reader(Message)
    # Prepared, as a step's statements are: a run's two lease statements were
    # mostly parsing and planning on the server (~1 ms of its time a run).
    [rows, history, owner_rows] = execute_batch(
        [
            (
                f"{_ACQUIRE} RETURNING {reader.select()}, {STAMP_RETURNING}, {_TURN_HAS_CALLS}, "
                f"{MARK_SET}",
                [owner, seconds, owner, session_id, owner, _RUNNABLE, _STARTS_TURN],
            ),
            (
                _HISTORY.format(columns=messages.select("m")),
                [session_id, MessageStatus.FINAL.value, session_id],
            ),
            (_OWNER, [session_id]),
        ],
        prepare=True,
    )
    if not rows:
        return None
    row = rows[0]
    session: Session = reader.instance(row)
    # The agent's configuration stamp as of this version, as a step commit returns it.
    session.config_stamp = (session.version, row[-3])  # type: ignore[attr-defined]
    if not row[-2]:
        # The turn has no tool call yet (a turn the web started): the run knows its calls
        # from its own commits, with no read (run_cache.RunContext.turn_calls).
        session.turn_calls_none = (session.version, session.turn)  # type: ignore[attr-defined]
    if owner_rows:
        # Read in the lease's transaction (no row without its mark): as of this version.
        has_memory, watched = owner_rows[0]
        owner_watch_note(owner_id=session.owner_id, watched=bool(watched))
        session.memory_known = (session.turn, bool(has_memory))  # type: ignore[attr-defined]
        if history:
            session.history_seed = [  # type: ignore[attr-defined]
                message
                for message in map(messages.instance, history)
                if message.seq is not None and message.seq <= session.message_seq
            ]
    return session


def lease_release(*, session_id: UUID | str, owner: str) -> bool:
    """Give the lease back, but only if the run has truly nothing left to do.

    The condition sits on the row itself, so a message that started a turn (or
    queued) a moment ago makes the release fail and the run go on.
    """
    [released] = execute_batch(
        [
            (
                # SQL names from model metadata (constants); every value is a bound parameter.
                f"""UPDATE {_TABLE}
                       SET lease_owner = NULL, lease_expires_at = NULL
                     WHERE id = %s AND lease_owner = %s
                       AND NOT (state = ANY(%s)) AND NOT (state = ANY(%s) AND queued_count > 0)
                 RETURNING id""",  # nosec B608
                [session_id, owner, _RUNNABLE, _STARTS_TURN],
            )
        ],
        prepare=True,
    )
    return bool(released)


def lease_drop(*, session_id: UUID | str, owner: str, after_s: float = 0.0) -> None:
    """Give the lease back unconditionally (the run stops; the sweeper decides what next,
    `after_s` from now at the earliest)."""
    with connection.cursor() as cursor:
        cursor.execute(
            # SQL names from model metadata (constants); every value is a bound parameter.
            f"UPDATE {_TABLE} SET lease_owner = NULL, lease_expires_at = now() + make_interval(secs => %s) "
            "WHERE id = %s AND lease_owner = %s",  # nosec B608
            [after_s, session_id, owner],
        )


def leases_renew(
    held: list[tuple[str, str]], seconds: float, *, due_within: float | None = None
) -> int:
    """Renew many leases in one statement; a lease someone else took is left alone.

    `due_within`: renew only leases ending within that many seconds (default:
    `seconds`, every one). A row another transaction holds locked is skipped,
    not waited for: it is almost always this process's own step commit, which
    renews the lease itself (its session UPDATE sets `lease_expires_at`). Waiting
    instead held the rows already renewed locked until the slowest step
    committed, and each step commit of those sessions queued behind the
    heartbeat: under a burst of turns the worker's commits ran in a convoy.
    """
    if not held:
        return 0
    with connection.cursor() as cursor:
        cursor.execute(
            # SQL names from model metadata (constants); every value is a bound parameter.
            f"""WITH due AS (
                    SELECT s.id FROM {_TABLE} AS s
                      JOIN unnest(%s::uuid[], %s::text[]) AS h(id, owner)
                        ON s.id = h.id AND s.lease_owner = h.owner
                     WHERE s.lease_expires_at < now() + make_interval(secs => %s)
                     ORDER BY s.id
                       FOR NO KEY UPDATE OF s SKIP LOCKED)
                UPDATE {_TABLE} AS s
                   SET lease_expires_at = now() + make_interval(secs => %s)
                  FROM due WHERE s.id = due.id""",  # nosec B608
            [
                [sid for sid, _ in held],
                [owner for _, owner in held],
                seconds if due_within is None else due_within,
                seconds,
            ],
        )
        return cursor.rowcount


class Heartbeat:
    """Renews, from one thread per process, the leases of the runs in flight here."""

    def __init__(self) -> None:
        self._held: dict[str, str] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._pid: int | None = None

    def hold(self, session_id: object, owner: str) -> None:
        with self._lock:
            self._held[str(session_id)] = owner
            if self._thread is None or not self._thread.is_alive() or self._pid != os.getpid():
                self._thread = threading.Thread(
                    target=self._beat, name="lease-heartbeat", daemon=True
                )
                self._pid = os.getpid()
                self._thread.start()

    def release(self, session_id: object) -> None:
        with self._lock:
            self._held.pop(str(session_id), None)

    def _beat(self) -> None:
        lease = settings.SESSION_LEASE_S
        interval = max(lease / 4, 0.1)
        wake = threading.Event()
        while True:
            wake.wait(interval)
            with self._lock:
                held = list(self._held.items())
            if not held:
                continue
            try:
                # A lease a step commit renewed since the last beat waits for the next:
                # none has less than half its length left (less a late beat's delay).
                leases_renew(held, lease, due_within=lease - interval)
            except Exception:  # noqa: BLE001 - a missed beat only shortens the lease
                logger.warning("lease heartbeat failed", exc_info=True)
            finally:
                connection.close()


heartbeat = Heartbeat()
