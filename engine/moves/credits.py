"""A run parked for credit pool points, and woken when they are granted.

`credits_park` moves tool_wait -> waiting_credits (the commit gives the lease back: no worker
waits); `pool_wake` grants a pool's queue in value / cost order (`billing_pool_dispatch`) and
moves each parked session whose request is granted back to tool_wait, enqueueing its run on
commit. Both are ordinary moves: a conditional UPDATE on the version with a Transition row.
The step that runs again finds its request granted by key (billing_pool_grant's step 1).
"""

import logging

from django.db import transaction

from billing.models import PoolRequest, PoolRequestStatus
from billing.selectors import pools_waiting
from billing.services import pool_dispatch
from engine.gates.credit_pool import PoolAnswer
from engine.moves.turn import build_step, metered_commit
from engine.store.commit import StaleSession
from record.dispatch import run_enqueue_on_commit
from record.events import EventSpec, EventType, Progress
from record.models import Session
from record.states import IllegalTransition, State, Trigger

logger = logging.getLogger(__name__)


def credits_park(session: Session, owner: str, gate: PoolAnswer) -> None:
    """The step's request waits for points: park the session (no worker, no lease)."""
    ask, grant = gate.ask, gate.grant
    assert ask is not None and grant is not None  # noqa: S101 - only a waiting gate parks
    data: Progress = {
        "stage": "credits_wait",
        "turn": session.turn,
        "tool": ask.action,
        "value": ask.value,
        "cost": ask.cost,
        "roi": grant.roi,
        "pool_free": max(grant.size - grant.in_use, 0),
    }
    if ask.note:
        data["note"] = ask.note[:500]
    metered_commit(
        build_step(
            session,
            owner,
            trigger=Trigger.CREDITS_WAIT,
            phase="credits_wait",
            reason=f"{ask.action}: {ask.cost} points at ROI {grant.roi:.3g} wait for the pool",
            events=[EventSpec(EventType.PROGRESS, data)],
        )
    )


def credits_wake(session: Session) -> bool:
    """Move a parked session whose points were granted back to its tool step; False when
    another waker (or a cancel) got there first."""
    try:
        with transaction.atomic():
            metered_commit(
                build_step(
                    session,
                    None,
                    trigger=Trigger.CREDITS_GRANTED,
                    phase="credits_granted",
                    reason="credit pool points granted",
                )
            )
            run_enqueue_on_commit(session.pk, session.value)
    except (StaleSession, IllegalTransition):
        return False
    return True


def pool_wake(*, pool_id: int | None = None) -> list[str]:
    """Grant what fits of a pool's queue (every pool with one: None) and wake each parked
    session whose request is granted, including one granted while it was parking (its
    waker found it still in tool_wait). The sessions woken."""
    for pool in [pool_id] if pool_id is not None else pools_waiting():
        pool_dispatch(pool_id=pool)
    parked = Session.objects.filter(state=State.WAITING_CREDITS.value)
    if pool_id is not None:
        parked = parked.filter(
            pk__in=PoolRequest.objects.filter(
                pool_id=pool_id, status=PoolRequestStatus.GRANTED
            ).values("session_id")
        )
    else:
        # The sweeper: every parked run whose request no longer waits (granted; refused by a
        # smaller size; gone with its pool) goes back to its step, which asks again.
        parked = parked.exclude(
            pk__in=PoolRequest.objects.filter(status=PoolRequestStatus.WAITING).values("session_id")
        )
    woken = []
    for session in parked:
        if credits_wake(session):
            woken.append(str(session.pk))
    if woken:
        logger.info("credit pool: woke %d session(s) %s", len(woken), woken)
    return woken
