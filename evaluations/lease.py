"""An evaluation's lease: one worker runs it at a time, and a dead worker's run is taken
over by another after its lease lapses.

The lease is (lease_owner, leased_until) on the evaluation row, taken and renewed with
conditional UPDATEs against the database clock. While a worker runs it, a heartbeat
thread renews it every third of EVALUATION_LEASE_S, so a replay that takes minutes does
not lose it. The sweeper (services.evaluations_sweep, on beat) hands a lapsed lease back
(lease_owner "" and a pickup grace) and sends the task again; the next worker resumes
after the last scored turn. A worker that lost its lease writes nothing more: every write
of scored turns is fenced by `lease_owner` (services._turns_write).
"""

import logging
import os
import socket
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

from django.conf import settings
from django.db import connection
from django.db.models import DateTimeField, ExpressionWrapper, Q, Value
from django.db.models.functions import Now

from .models import Evaluation
from .states import EvaluationState

logger = logging.getLogger(__name__)

# The states a worker runs (a queued one it moves to running first).
RUNS = (EvaluationState.QUEUED.value, EvaluationState.RUNNING.value)


class LeaseLost(Exception):
    """Another worker took the evaluation over (this one was thought dead)."""


def lease_owner_new() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"[:100]


def lease_until(seconds: float | None = None) -> ExpressionWrapper:
    """The database's now() plus `seconds` (the lease by default)."""
    seconds = settings.EVALUATION_LEASE_S if seconds is None else seconds
    return ExpressionWrapper(
        Now() + Value(timedelta(seconds=seconds)), output_field=DateTimeField()
    )


def lease_take(*, evaluation_id: int, owner: str) -> bool:
    """Take the lease if nobody holds it: never taken, handed back by the sweeper, or
    lapsed. False when another live worker runs it, or it has ended."""
    return bool(
        Evaluation.objects.filter(pk=evaluation_id, state__in=RUNS)
        .filter(Q(lease_owner="") | Q(leased_until__isnull=True) | Q(leased_until__lt=Now()))
        .update(lease_owner=owner, leased_until=lease_until())
    )


def lease_renew(*, evaluation_id: int, owner: str) -> bool:
    return bool(
        Evaluation.objects.filter(pk=evaluation_id, lease_owner=owner).update(
            leased_until=lease_until()
        )
    )


@contextmanager
def lease_kept(*, evaluation_id: int, owner: str) -> Iterator[threading.Event]:
    """Renew the lease on a thread of its own while the body runs; the event it yields
    is set once the lease is found lost."""
    stop, lost = threading.Event(), threading.Event()
    period = settings.EVALUATION_LEASE_S / 3

    def beat() -> None:
        try:
            while not stop.wait(period):
                if not lease_renew(evaluation_id=evaluation_id, owner=owner):
                    lost.set()
                    return
        except Exception:  # a beat that fails lets the lease lapse: the sweeper's case
            logger.exception("evaluation lease heartbeat failed: evaluation=%s", evaluation_id)
        finally:
            connection.close()

    thread = threading.Thread(target=beat, name=f"evaluation-{evaluation_id}-lease", daemon=True)
    thread.start()
    try:
        yield lost
    finally:
        stop.set()
        thread.join(timeout=period + 5)
