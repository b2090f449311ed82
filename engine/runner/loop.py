"""The run loop: take the lease, run steps until nothing is left, give the lease back.

Each step is one of: start the next queued turn, call the model, run the tool
calls it asked for, or move from tool results back to the model. Each ends in
exactly one move (engine/moves/turn.py). No database connection is held across a model or
tool call, and no transaction is open during one.
"""

import logging
import time
from dataclasses import dataclass
from typing import Literal
from uuid import UUID

from django.conf import settings
from django.db import connection

from engine.gates.budget import StepDeferred
from engine.gates.children import ChildrenWait, children_running
from engine.gates.metering import CreditsWait
from engine.moves.ask_user import queued_answer
from engine.moves.turn import tool_loop_next, turn_cancel, turn_fail, turn_start
from engine.phases.model import model_step
from engine.phases.node import node_step
from engine.phases.tools import tool_step
from engine.run_cache import RunContext
from engine.runner.lease import heartbeat, lease_drop, lease_release, lease_take, worker_identity
from engine.store.commit import StaleSession
from observability import logs, metrics, tracing
from record.dispatch import run_enqueue, run_enqueue_later
from record.models import Session
from record.states import RUNNABLE, STARTS_TURN, State
from runtime import health

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunResult:
    steps: int
    stopped: Literal[
        "idle", "not_acquired", "lease_lost", "crashed", "waiting", "deferred", "requeued"
    ]


def session_run(*, session_id: UUID | str, owner: str | None = None) -> RunResult:
    result = _session_run(session_id=session_id, owner=owner)
    metrics.RUNS.labels(result.stopped).inc()
    return result


def _session_run(*, session_id: UUID | str, owner: str | None = None) -> RunResult:
    """Run a session's pending work to the end, holding its lease throughout.

    1. Take the lease (or return at once if another worker holds it).
    2. Repeat: reload the session, run one step. A heartbeat renews the lease
       meanwhile, so a short lease still covers a long model call.
    3. When nothing is runnable, release the lease; the release fails if
       work arrived meanwhile, and the loop goes on.
    """
    owner = owner or worker_identity()
    session = lease_take(session_id=session_id, owner=owner, seconds=settings.SESSION_LEASE_S)
    if session is None:
        connection.close()
        return RunResult(0, "not_acquired")
    heartbeat.hold(session_id, owner)
    steps = 0
    run = RunContext()
    # `session` is the row as our own last write returned it: the lease's, then each commit's.
    current = True
    health.figures.run_begin()
    try:
        while True:
            if not current:
                session = _refresh(session_id, session)
            if session is not None and session.lease_owner is None and not _work_left(session):
                # Our last commit gave the lease back (step_commit): nothing left to run.
                return RunResult(steps, "idle")
            if session is None or session.lease_owner != owner:
                # Taken over after our lease ran out (a pause, a slow database):
                # our last commit was refused, so nothing ran twice.
                return RunResult(steps, "lease_lost")
            version = session.version
            state = session.state
            if steps:
                _pace()
            started = health.figures.step_begin()
            try:
                progressed = _traced_step(session, owner, run)
                if progressed:
                    metrics.step_observe(state, time.perf_counter() - started)
            except StaleSession:
                logger.info("session %s moved under us; reloading", session_id)
                session = None
                continue
            except (StepDeferred, ChildrenWait, CreditsWait) as aside:
                return RunResult(steps, _step_aside(aside, session, owner))
            except Exception:
                health.figures.step_end(started, ok=False)
                logger.exception("step of session %s crashed", session_id)
                _record_crash(session_id, owner)
                return RunResult(steps, "crashed")
            # Our commit's RETURNING gave back what others change without a
            # version bump (cancel flag, queued count, lease owner): no re-read
            # before the next step unless a cancel needs its reason and actor.
            # Anything that lands after the commit is seen by the next commit's
            # conditions (version, lease, cancel guard) or by lease_release.
            current = session.version != version and not session.cancel_requested
            if progressed:
                health.figures.step_end(started)
                steps += 1
            elif lease_release(session_id=session_id, owner=owner):
                return RunResult(steps, "idle")
            else:
                current = False
    finally:
        health.figures.run_end()
        heartbeat.release(session_id)
        connection.close()


def _traced_step(session: Session, owner: str, run: RunContext) -> bool:
    state = session.state
    with (
        logs.bound(session=str(session.pk), turn=session.turn, step=session.step),
        tracing.step_span(
            # A step that may start a turn runs under the caller's context
            # (the REST request's): the new turn's trace starts there.
            "" if State(state) in STARTS_TURN else session.trace_parent,
            session_id=str(session.pk),
            state=state,
            turn=session.turn,
        ),
    ):
        return run_step(session, owner, run)


def _step_aside(
    aside: StepDeferred | ChildrenWait | CreditsWait, session: Session, owner: str
) -> Literal["deferred", "waiting"]:
    """The step waits for something no worker should hold a run for: the lease is dropped
    until it may have come, and the run is woken then."""
    session_id = session.pk
    if isinstance(aside, StepDeferred):
        # A rate limit: hold no worker while the window turns; the run is
        # enqueued for then, and the sweeper stays away until then.
        heartbeat.release(session_id)
        lease_drop(session_id=session_id, owner=owner, after_s=aside.seconds)
        run_enqueue_later(session_id, aside.seconds, session.value)
        return "deferred"
    if isinstance(aside, ChildrenWait):
        # Other agents' runs answer this step: no worker waits for them; each one's
        # end wakes this run, the sweeper only covers a lost wake-up.
        heartbeat.release(session_id)
        lease_drop(session_id=session_id, owner=owner, after_s=settings.CHILDREN_RECHECK_S)
        if not children_running(session_id):
            # The last one ended while we held the lease: its wake-up was refused.
            try:
                run_enqueue(session_id, session.value)
            except Exception:  # noqa: BLE001 - the sweeper looks again after the recheck
                logger.warning("could not wake session %s", session_id, exc_info=True)
        return "waiting"
    # Points held by in-flight calls: no worker waits for them; the
    # sweeper picks the run up again once the short lease runs out.
    lease_drop(session_id=session_id, owner=owner, after_s=settings.CREDITS_WAIT_RETRY_S)
    return "waiting"


def _work_left(session: Session) -> bool:
    """What lease_release asks of the row: is there a step to run or a turn to start?"""
    state = State(session.state)
    return state in RUNNABLE or (state in STARTS_TURN and session.queued_count > 0)


def _pace() -> None:
    """Pause between steps while the sweeper says the database or the model is slow
    (runtime/health.py): the lease heartbeat keeps the lease meanwhile, and no
    connection is held."""
    delay = health.pacing_delay()
    if delay > 0:
        connection.close()
        time.sleep(delay)


def _refresh(session_id: UUID | str, session: Session | None) -> Session | None:
    """The session as of now, cheaply: the row is read whole only when its
    version moved; otherwise only the columns others may change without a
    version bump (a cancel with its reason and who asked, queued messages,
    the lease)."""
    if session is not None:
        with connection.cursor() as cursor:
            cursor.execute(
                # SQL names from model metadata (constants); every value is a bound parameter.
                "SELECT version, cancel_requested, cancel_reason, cancel_actor, queued_count, lease_owner "
                f'FROM "{Session._meta.db_table}" WHERE id = %s',  # nosec B608
                [session_id],
            )
            row = cursor.fetchone()
        if row is None:
            return None
        if row[0] == session.version:
            (
                session.cancel_requested, session.cancel_reason, session.cancel_actor,
                session.queued_count, session.lease_owner,
            ) = row[1:]  # fmt: skip
            return session
    return Session.objects.filter(pk=session_id).first()


def run_step(session: Session, owner: str, run: RunContext | None = None) -> bool:
    """Run the one step the session's state calls for; False if there is none."""
    state = State(session.state)
    if session.cancel_requested and state in RUNNABLE:
        turn_cancel(session=session, owner=owner)
        return True
    if state in STARTS_TURN:
        if session.queued_count > 0:
            # A message queued while the turn ran answers the question it then asked.
            if state == State.PAUSED_FOR_USER and queued_answer(session, owner):
                return True
            return turn_start(session=session, lease_owner=owner)
        return False
    if state == State.PROCESSING:
        if session.workflow_version_id is not None:
            node_step(session, owner, run)  # a workflow run walks its graph instead
        else:
            model_step(session, owner, run)
    elif state == State.TOOL_WAIT:
        tool_step(session, owner, run.figures if run is not None else None)
    elif state == State.TOOL_LOOP:
        tool_loop_next(session, owner)
    else:
        return False
    return True


def _record_crash(session_id: UUID | str, owner: str) -> None:
    """Turn an unexpected failure into an `error` state the operator can see."""
    try:
        session = Session.objects.get(pk=session_id)
        if State(session.state) in RUNNABLE and session.lease_owner == owner:
            turn_fail(
                session, owner, "internal error while running the step", reason="internal error"
            )
    except Exception:  # noqa: BLE001
        logger.exception("could not record the crash of session %s", session_id)
        lease_drop(session_id=session_id, owner=owner)
