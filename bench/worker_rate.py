"""Benchmark 2: steps per second for one worker process, instant model.

One real Celery worker (threads pool, the Procfile's default concurrency)
runs N sessions' demo turns at once: this process posts one demo request into
each session from 16 threads (`services.message_post`, which commits the turn
start and enqueues the run), the worker does the rest (10 steps a turn).
By default the worker stops consuming the queue while the turns are posted
and is then let go (see `runs.drive`); the window runs from that release (or,
with `--post-live`, from the first post) to the last step commit.
Steps/s = worker steps / window. The worker's CPU time per step is read from
/proc, so a figure taken on a busy machine can be told apart from a slow engine.
"""

from . import fixtures, runs
from .procs import Processes
from .results_model import Result, figure
from .stats import summary

POST_THREADS = 16


def run(procs: Processes, *, sessions: int, concurrency: int, live: bool = False) -> Result:

    result = Result(
        name="worker",
        title="Steps per second, one worker process (demo agent, instant rules model)",
        params={
            "sessions": sessions,
            "worker_concurrency": concurrency,
            "post_threads": POST_THREADS,
            "posting": "live" if live else "paused queue, then released",
            "agent": "bench-demo",
        },
    )
    node = procs.start_worker("worker", concurrency=concurrency)
    ready_s = procs.wait_worker("worker", node)
    # Warm the worker up (imports, pool, compiled validators) on sessions of its own.
    warm = fixtures.sessions_create("bench-demo", 2)
    warm_ids = [str(s.pk) for s in warm]
    watcher = runs.Watcher(warm_ids)
    watcher.start(timeout=30)
    runs.post_all(warm, fixtures.DEMO_REQUEST, threads=2)
    if not watcher.wait():
        raise RuntimeError(f"warm-up turns did not finish:\n{procs.log_tail('worker')}")

    targets = fixtures.sessions_create("bench-demo", sessions)
    ids = [str(s.pk) for s in targets]
    run = runs.drive(
        procs,
        ["worker"],
        [node],
        targets,
        fixtures.DEMO_REQUEST,
        post_threads=POST_THREADS,
        live=live,
        timeout=240,
        label="worker_rate",
    )
    # The worker runs on: the CLI stops it, or hands it on to `e2e` (same threads).
    posts, started, cpu_used, machine, spy_file = (
        run.posts,
        run.started,
        run.cpu_s,
        run.machine,
        run.pyspy,
    )

    rows = runs.transitions(ids)
    steps = runs.step_latencies(rows)
    n = len(steps)
    last_commit = max(r.at for r, _ in steps)
    first_worker = min(r.at for r, _ in steps)
    wall = last_commit - started
    # A turn's clock starts at its post, or at the release when the queue was paused.
    posted = {sid: max(start, started) for sid, (start, _end) in zip(ids, posts, strict=True)}
    turns = runs.turn_latencies(rows, posted)
    peak_leased = max(s.leased for s in run.samples)
    result.figures = [
        figure("steps_per_s", "worker steps/s (window start -> last commit)", n / wall, "steps/s"),
        figure(
            "steps_per_s_busiest_1s",
            "worker steps/s, busiest 1 s",
            runs.busiest_window([r.at for r, _ in steps]),
            "steps/s",
        ),
        figure(
            "worker_cpu_ms_per_step",
            "worker CPU per step (all its threads)",
            cpu_used / n * 1000,
            "ms",
        ),
        figure("turn_p50_s", "turn latency (post -> finished), p50", runs.p(turns, 50), "s"),
        figure("runs_in_flight_peak", "runs in flight, peak", float(peak_leased)),
    ]
    result.details = {
        "worker_ready_s": round(ready_s, 2),
        "worker_steps": n,
        "turns": len(turns),
        "steps_per_turn": round(n / max(len(turns), 1), 2),
        "wall_s": round(wall, 3),
        "posting_s": round(max(e for _, e in posts) - min(b for b, _ in posts), 3),
        "first_worker_commit_after_s": round(first_worker - started, 3),
        "steady_steps_per_s": round(n / (last_commit - first_worker), 1)
        if last_commit > first_worker
        else None,
        "step_latency_ms": summary([lat * 1000 for _, lat in steps]),
        "step_latency_ms_by_trigger": {
            trig: summary([lat * 1000 for r, lat in steps if r.trigger == trig])
            for trig in sorted({r.trigger for r, _ in steps})
        },
        "turn_latency_s": summary(turns),
        "post_ms": summary([(e - s) * 1000 for s, e in posts]),
        "worker_cpu_s": round(cpu_used, 3),
        "worker_cpu_share_of_one_core_pct": round(100 * cpu_used / wall, 1),
        "pyspy": spy_file,
        **machine,
    }
    result.notes.append(
        "Steps are the worker's step_commits (Transition rows); the turn start, committed by message_post in "
        "the posting process, is not counted."
    )
    return result
