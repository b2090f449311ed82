"""Benchmark `recovery`: SIGKILL of a worker mid-turn -> the next step starting (target p95 ≤ 3 s).

Real processes: Celery beat (the sweeper, every SWEEPER_INTERVAL_S) and a
Celery worker, on the bench database and queue, with the defaults
SESSION_LEASE_S=2 and SWEEPER_INTERVAL_S=0.5. The agent `bench-recovery`
answers in one tool round on a rules model that sleeps 1 s per call (turn
start, model 1 s -> tool -> tool-loop move -> model 1 s -> answer), so a
worker killed at a random moment of a turn is nearly always mid-step.

For each kill: a turn is posted (`message_post`), and once a worker holds
the session's lease this process waits a random 0-2 s; if the turn is still
running, the worker holding the lease (its pid is part of the lease owner)
gets SIGKILL (its whole process group), and a new worker is started at once,
as a supervisor would (`restart`). Nothing else tells the platform: the dead
worker's heartbeat stops, its lease runs out (≤ SESSION_LEASE_S after its
last renewal), the sweeper re-enqueues the run, a worker takes the lease and
runs the step again. Measured from the kill (this process's clock; the
database is on the same machine, so its timestamps are comparable):

- **next step starts**: the new worker takes the session's lease (polled every
  10 ms; the time is the earlier of the poll that saw it and the database
  time of the acquisition, `lease_expires_at - SESSION_LEASE_S`); the run loop
  starts the step right after taking the lease;
- **first new row**: the first Transition / Checkpoint / ModelCall row of the
  session stamped after the kill, i.e. the first commit of the redone step
  (it includes that step's own work: up to 1 s of model latency);
- **replacement ready**: the new worker's "ready." log line.

A second series (`standby`) keeps a second worker running, as any
deployment with more than one worker process does: the killed worker is
still restarted at once, but the survivor takes the run over, so the figure
does not include a worker's start-up.
"""

import os
import random
import signal
import time
from dataclasses import asdict, dataclass
from typing import Any

from . import fixtures
from .procs import STOP, Processes
from .results_model import Result, figure
from .runs import MachineLoad
from .stats import percentile, summary

AGENT = "bench-recovery"
POLL_S = 0.01
KILL_WINDOW_S = (0.0, 2.0)


@dataclass
class Sample:
    mode: str
    kill_after_take_s: float  # how long after the worker took the turn it was killed
    state_at_kill: str
    step_start_s: float  # kill -> the new worker holds the lease
    first_row_s: float | None  # kill -> first Transition/Checkpoint/ModelCall after the kill
    replacement_ready_s: float | None  # kill -> the new worker logged "ready."
    recovered_by: str  # restarted | survivor
    turn_finished: bool


def _conn() -> Any:
    import psycopg

    return psycopg.connect(os.environ["DATABASE_URL"], autocommit=True)


def _row(conn: Any, session_id: str) -> tuple[str, str | None, float | None]:
    row = conn.execute(
        "SELECT state, lease_owner, extract(epoch FROM lease_expires_at)::float8 "
        "FROM agent_sessions_session WHERE id = %s",
        [session_id],
    ).fetchone()
    return row[0], row[1], row[2]


def _first_row_after(conn: Any, session_id: str, after: float) -> float | None:
    row = conn.execute(
        """SELECT least(
             (SELECT min(extract(epoch FROM at)) FROM agent_sessions_transition
               WHERE session_id = %(s)s AND at > to_timestamp(%(t)s)),
             (SELECT min(extract(epoch FROM created_at)) FROM agent_sessions_checkpoint
               WHERE session_id = %(s)s AND created_at > to_timestamp(%(t)s)),
             (SELECT min(extract(epoch FROM created_at)) FROM agent_sessions_modelcall
               WHERE session_id = %(s)s AND created_at > to_timestamp(%(t)s)))::float8""",
        {"s": session_id, "t": after},
    ).fetchone()
    return row[0]


def _pid_of(owner: str | None) -> int | None:
    # worker_identity(): host:pid:thread:random
    try:
        return int(str(owner).split(":")[1])
    except (IndexError, ValueError):
        return None


def _ready_in_log(procs: Processes, name: str) -> bool:
    path = procs.logs.get(name)
    return bool(path and path.exists() and " ready." in path.read_text(errors="replace"))


class Workers:
    """The bench's worker processes, by name; a killed one is replaced under the next name."""

    def __init__(self, procs: Processes, concurrency: int) -> None:
        self.procs = procs
        self.concurrency = concurrency
        self.count = 0
        self.names: list[str] = []

    def start(self) -> str:
        # Four log slots, reused in turn (at most two workers live at once): the
        # logs of the last few workers, killed ones included, stay in .data/bench-logs.
        # A slot still held by a live worker (the standby series keeps one running) is skipped.
        while (name := f"recovery-w{self.count % 4}") in self.procs.procs:
            self.count += 1
        self.count += 1
        self.procs.start_worker(name, concurrency=self.concurrency)
        self.names.append(name)
        return name

    def by_pid(self, pid: int | None) -> str | None:
        for name in self.names:
            proc = self.procs.procs.get(name)
            if proc is not None and proc.pid == pid:
                return name
        return None

    def kill(self, name: str) -> None:
        proc = self.procs.procs.pop(name)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        self.names.remove(name)

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not all(_ready_in_log(self.procs, n) for n in self.names):
            self.procs._check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"workers not ready:\n{self.procs.log_tail(self.names[-1])}")
            time.sleep(0.05)


def _wait_taken(conn: Any, session_id: str, timeout: float = 30.0) -> tuple[str, float]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if STOP.is_set():
            raise KeyboardInterrupt("stopping")
        state, owner, _exp = _row(conn, session_id)
        if owner and state in ("processing", "tool_wait", "tool_loop"):
            return owner, time.time()
        time.sleep(POLL_S)
    raise RuntimeError(f"no worker took session {session_id} within {timeout} s")


def _wait_finished(conn: Any, session_id: str, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if STOP.is_set():
            raise KeyboardInterrupt("stopping")
        state, owner, _exp = _row(conn, session_id)
        if state in ("finished", "error", "cancelled") and owner is None:
            if state != "finished":
                raise RuntimeError(f"session {session_id} ended in {state}")
            return True
        time.sleep(0.02)
    return False


def _one_kill(
    procs: Processes,
    workers: Workers,
    conn: Any,
    session: Any,
    rng: random.Random,
    mode: str,
    lease_s: float,
) -> Sample | None:
    from record.models import Session
    from sessions.services import message_post

    session_id = str(session.pk)
    message_post(session=Session.objects.get(pk=session.pk), content="what time is it?")
    from django.db import connection

    connection.close()
    _owner, taken_at = _wait_taken(conn, session_id)
    delay = rng.uniform(*KILL_WINDOW_S)
    time.sleep(max(taken_at + delay - time.time(), 0))
    state, owner, _exp = _row(conn, session_id)
    victim = workers.by_pid(_pid_of(owner))
    if state not in ("processing", "tool_wait", "tool_loop") or victim is None:
        _wait_finished(conn, session_id)
        return None  # the turn ended before the kill: no sample
    workers.kill(victim)
    killed_at = time.time()
    replacement = workers.start()  # the supervisor restarts it at once
    ready_at: float | None = None
    step_start: float | None = None
    first_row: float | None = None
    recovered_by = ""
    state_now, owner_now = state, owner
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (step_start is None or first_row is None):
        if STOP.is_set():
            raise KeyboardInterrupt("stopping")
        now = time.time()
        if ready_at is None and _ready_in_log(procs, replacement):
            ready_at = now
        state_now, owner_now, expires = _row(conn, session_id)
        if step_start is None and owner_now and owner_now != owner:
            acquired = expires - lease_s if expires else now
            step_start = min(now, acquired)
            pid = _pid_of(owner_now)
            recovered_by = (
                "restarted" if workers.by_pid(pid) == replacement or pid is None else "survivor"
            )
        if step_start is not None and first_row is None:
            first_row = _first_row_after(conn, session_id, killed_at)
        if state_now in ("finished", "error", "cancelled") and owner_now is None:
            first_row = first_row or _first_row_after(conn, session_id, killed_at)
            break
        time.sleep(POLL_S)
    if step_start is None:
        raise RuntimeError(
            f"session {session_id} was not taken over within 60 s after the kill "
            f"(state {state_now}, lease {owner_now}):\n{procs.log_tail(replacement)}"
        )
    finished = _wait_finished(conn, session_id)
    if ready_at is None:
        workers.wait_ready()
        ready_at = time.time() if _ready_in_log(procs, replacement) else None
    return Sample(
        mode=mode,
        kill_after_take_s=round(delay, 3),
        state_at_kill=state,
        step_start_s=round(step_start - killed_at, 3),
        first_row_s=round(first_row - killed_at, 3) if first_row else None,
        replacement_ready_s=round(ready_at - killed_at, 3) if ready_at else None,
        recovered_by=recovered_by,
        turn_finished=finished,
    )


def _series(
    procs: Processes,
    workers: Workers,
    conn: Any,
    session: Any,
    rng: random.Random,
    mode: str,
    kills: int,
    lease_s: float,
) -> list[Sample]:
    samples: list[Sample] = []
    attempts = 0
    while len(samples) < kills:
        attempts += 1
        if attempts > kills * 3:
            raise RuntimeError(f"only {len(samples)} of {kills} kills landed mid-turn")
        workers.wait_ready()
        sample = _one_kill(procs, workers, conn, session, rng, mode, lease_s)
        if sample is not None:
            samples.append(sample)
            print(
                f"bench:   recovery {mode} kill {len(samples)}/{kills}: killed {sample.kill_after_take_s:.2f} s "
                f"into the turn ({sample.state_at_kill}); next step started after {sample.step_start_s:.2f} s, "
                f"first new row after {sample.first_row_s} s, replacement ready after "
                f"{sample.replacement_ready_s} s",
                flush=True,
            )
    return samples


def run(procs: Processes, *, kills: int, standby_kills: int, concurrency: int = 8) -> Result:
    from django.conf import settings

    lease_s = float(settings.SESSION_LEASE_S)
    result = Result(
        name="recovery",
        title="Recovery after SIGKILL of the worker mid-turn (worker + beat processes)",
        params={
            "kills": kills,
            "standby_kills": standby_kills,
            "agent": AGENT,
            "model_latency_s": fixtures.RECOVERY_LATENCY_S,
            "kill_window_s": list(KILL_WINDOW_S),
            "SESSION_LEASE_S": lease_s,
            "SWEEPER_INTERVAL_S": float(settings.SWEEPER_INTERVAL_S),
            "worker_concurrency": concurrency,
        },
    )
    rng = random.Random(20261129)
    procs.start_beat()
    workers = Workers(procs, concurrency)
    workers.start()
    workers.wait_ready()
    (session,) = fixtures.sessions_create(AGENT, 1)
    load = MachineLoad()
    load.start()
    with _conn() as conn:
        # One turn without a kill: imports, pools and caches of the worker are warm.
        from record.models import Session
        from sessions.services import message_post

        message_post(session=Session.objects.get(pk=session.pk), content="warm up")
        if not _wait_finished(conn, str(session.pk)):
            raise RuntimeError(f"warm-up turn did not finish:\n{procs.log_tail(workers.names[0])}")
        samples = _series(procs, workers, conn, session, rng, "restart", kills, lease_s)
        standby: list[Sample] = []
        if standby_kills:
            workers.start()
            workers.wait_ready()
            standby = _series(procs, workers, conn, session, rng, "standby", standby_kills, lease_s)
    machine = load.stop()
    for name in list(workers.names):
        procs.stop(name)
    procs.stop("beat")

    def p(values: list[float], q: float) -> float:
        return percentile(values, q)

    starts = [s.step_start_s for s in samples]
    rows = [s.first_row_s for s in samples if s.first_row_s is not None]
    ready = [s.replacement_ready_s for s in samples if s.replacement_ready_s is not None]
    result.figures = [
        figure(
            "step_start_p50_s",
            "SIGKILL -> next step starts (new worker at once), p50",
            p(starts, 50),
            "s",
        ),
        figure(
            "step_start_p95_s",
            "SIGKILL -> next step starts (new worker at once), p95",
            p(starts, 95),
            "s",
            le=3,
        ),
        figure(
            "first_row_p50_s",
            "SIGKILL -> first new Transition/Checkpoint/ModelCall row, p50",
            p(rows, 50),
            "s",
        ),
        figure(
            "first_row_p95_s",
            "SIGKILL -> first new Transition/Checkpoint/ModelCall row, p95",
            p(rows, 95),
            "s",
        ),
        figure(
            "replacement_ready_p50_s",
            "SIGKILL -> replacement worker ready (its start-up), p50",
            p(ready, 50),
            "s",
        ),
    ]
    if standby:
        result.figures += [
            figure(
                "standby_step_start_p50_s",
                "with a second worker running: SIGKILL -> next step starts, p50",
                p([s.step_start_s for s in standby], 50),
                "s",
            ),
            figure(
                "standby_step_start_p95_s",
                "with a second worker running: SIGKILL -> next step starts, p95",
                p([s.step_start_s for s in standby], 95),
                "s",
            ),
        ]
    result.details = {
        "step_start_s": summary(starts),
        "first_row_s": summary(rows),
        "replacement_ready_s": summary(ready),
        "standby_step_start_s": summary([s.step_start_s for s in standby]),
        "standby_first_row_s": summary([s.first_row_s for s in standby if s.first_row_s]),
        "samples": [asdict(s) for s in samples],
        "standby_samples": [asdict(s) for s in standby],
        **machine,
    }
    result.notes.append(
        "Next step starts = a worker takes the dead worker's lease (the run loop starts the step at "
        "once); the first new row comes when that step commits, so it adds the step's own time (a model "
        "step: 1 s of model latency)."
    )
    return result
