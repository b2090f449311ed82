"""Leases: one worker runs a session at a time, and a dead worker's lease runs out.

A lease is the pair (lease_owner, lease_expires_at) on the session row, taken
and renewed with conditional UPDATEs against the database clock. While a run is
in flight a heartbeat thread renews the leases this process holds, so a short
lease (fast takeover after a crash) does not expire under a long model call.
"""

import os
import socket
import threading
import uuid
from uuid import UUID

from django.conf import settings
from django.db import connection

from ..models import Session
from ..states import RUNNABLE, TURN_ENDED

_TABLE = Session._meta.db_table
_RUNNABLE = [s.value for s in RUNNABLE]
_TURN_ENDED = [s.value for s in TURN_ENDED]


def worker_identity() -> str:
    """A lease owner id unique to this process and thread."""
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}:{uuid.uuid4().hex[:6]}"


def lease_acquire(*, session_id: UUID | str, owner: str, seconds: float) -> bool:
    """Take the lease if it is free, expired or already ours, and there is work."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""UPDATE {_TABLE}
                   SET lease_owner = %s, lease_expires_at = now() + make_interval(secs => %s)
                 WHERE id = %s
                   AND (lease_owner IS NULL OR lease_owner = %s OR lease_expires_at < now())
                   AND (state = ANY(%s) OR (state = ANY(%s) AND queued_count > 0))""",
            [owner, seconds, session_id, owner, _RUNNABLE, _TURN_ENDED],
        )
        return cursor.rowcount == 1


def lease_release(*, session_id: UUID | str, owner: str) -> bool:
    """Give the lease back, but only if the run has truly nothing left to do.

    The condition sits on the row itself, so a message that started a turn (or
    queued) a moment ago makes the release fail and the run go on.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            f"""UPDATE {_TABLE}
                   SET lease_owner = NULL, lease_expires_at = NULL
                 WHERE id = %s AND lease_owner = %s
                   AND NOT (state = ANY(%s)) AND NOT (state = ANY(%s) AND queued_count > 0)""",
            [session_id, owner, _RUNNABLE, _TURN_ENDED],
        )
        return cursor.rowcount == 1


def lease_drop(*, session_id: UUID | str, owner: str) -> None:
    """Give the lease back unconditionally (the run stops; the sweeper decides what next)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {_TABLE} SET lease_owner = NULL, lease_expires_at = now() WHERE id = %s AND lease_owner = %s",
            [session_id, owner],
        )


class Heartbeat:
    """Renews, from one thread per process, the leases of the runs in flight here."""

    def __init__(self) -> None:
        self._held: dict[str, str] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()

    def hold(self, session_id: UUID | str, owner: str) -> None:
        with self._lock:
            self._held[str(session_id)] = owner
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._beat, name="lease-heartbeat", daemon=True)
                self._thread.start()

    def release(self, session_id: UUID | str) -> None:
        with self._lock:
            self._held.pop(str(session_id), None)

    def _beat(self) -> None:
        lease = settings.SESSION_LEASE_S
        while True:
            self._wake.wait(max(lease / 3, 0.2))
            with self._lock:
                held = list(self._held.items())
            if not held:
                continue
            try:
                with connection.cursor() as cursor:
                    for session_id, owner in held:
                        cursor.execute(
                            f"UPDATE {_TABLE} SET lease_expires_at = now() + make_interval(secs => %s) "
                            "WHERE id = %s AND lease_owner = %s",
                            [lease, session_id, owner],
                        )
            except Exception:  # noqa: BLE001 - a missed beat only shortens the lease
                pass
            finally:
                connection.close()


heartbeat = Heartbeat()
