"""Benchmark 4: runs in flight at 2 s model latency, one worker process.

200 sessions each start one turn at once (posted from 16 threads through
`services.message_post` while the worker's consumer is paused, then released
at once; `--post-live` posts while it runs); the agent does one tool round on a `rules` model
endpoint with `options: {latency_s: 2}`, so a turn is 3 worker steps: model
call (2 s) -> tool (the built-in clock; the same commit makes the tool-loop
move) -> model call (2 s) and answer. One Celery worker process with a threads pool of 250 runs them.

The issue asks for "a model that takes 2 s per call (a local fake server)";
the OpenAI-compatible adapter does not exist yet, so the 2 s is the rules
adapter sleeping on the worker's shared asyncio loop (`latency_s`), which
costs the worker no thread and no socket: a real HTTP model adds its client's
cost on top.

Figures: runs in flight at the peak (sessions whose lease a worker holds,
sampled every 50 ms), worker steps/s while the runs are in flight (release
-> last commit, and the busiest second), step latency as each session
saw it (for a model step that includes the 2 s), and how far model steps
ran over the 2 s.
"""

from . import fixtures, runs
from .procs import Processes
from .results_model import Result, figure
from .stats import summary

POST_THREADS = 16
MODEL_TRIGGERS = ("tool_calls", "answer")


def run(
    procs: Processes, *, sessions: int, concurrency: int, workers: int = 1, live: bool = False
) -> Result:

    latency = fixtures.SLOW_LATENCY_S
    result = Result(
        name="inflight",
        title=f"Runs in flight at {latency:g} s model latency, one worker process",
        params={
            "sessions": sessions,
            "worker_concurrency": concurrency,
            "worker_processes": workers,
            "posting": "live" if live else "paused queue, then released",
            "post_threads": POST_THREADS,
            "model_latency_s": latency,
            "agent": "bench-one-round-2s",
        },
    )
    # The target is about one worker process; `--inflight-workers 2` splits the threads over
    # two processes (one per core here) to show what the GIL costs.
    threads = -(-concurrency // workers)
    names = ["worker"] if workers == 1 else [f"worker{i + 1}" for i in range(workers)]
    nodes = {name: procs.start_worker(name, concurrency=threads) for name in names}
    ready_s = max(procs.wait_worker(name, node) for name, node in nodes.items())
    # Warm-up on the instant twin of the agent (same tool, same steps).
    warm = fixtures.sessions_create("bench-one-round", 4)
    watcher = runs.Watcher([str(s.pk) for s in warm])
    watcher.start(timeout=30)
    runs.post_all(warm, "what time is it?", threads=4)
    if not watcher.wait():
        raise RuntimeError(f"warm-up turns did not finish:\n{procs.log_tail(names[0])}")

    targets = fixtures.sessions_create("bench-one-round-2s", sessions)
    ids = [str(s.pk) for s in targets]
    run = runs.drive(
        procs,
        names,
        list(nodes.values()),
        targets,
        "what time is it?",
        post_threads=POST_THREADS,
        live=live,
        timeout=180,
        label="in_flight",
    )
    for name in names:
        procs.stop(name)
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
    wall = last_commit - started
    latencies = [lat for _, lat in steps]
    model_excess = [lat - latency for r, lat in steps if r.trigger in MODEL_TRIGGERS]
    # A turn's clock starts at its post, or at the release when the queue was paused.
    posted = {sid: max(start, started) for sid, (start, _end) in zip(ids, posts, strict=True)}
    turns = runs.turn_latencies(rows, posted)
    peak = max(s.leased for s in run.samples)
    result.figures = [
        figure("runs_in_flight_peak", "runs in flight, peak", float(peak), "runs", ge=200),
        figure(
            "steps_per_s",
            "worker steps/s (window start -> last commit)",
            n / wall,
            "steps/s",
            ge=100,
        ),
        figure(
            "steps_per_s_busiest_1s",
            "worker steps/s, busiest 1 s",
            runs.busiest_window([r.at for r, _ in steps]),
            "steps/s",
        ),
        figure(
            "step_latency_p95_s",
            "step latency, p95 (model steps include the 2 s)",
            runs.p(latencies, 95),
            "s",
        ),
        figure(
            "model_step_excess_p95_ms",
            "model step beyond the 2 s latency, p95",
            runs.p(model_excess, 95, 1000),
            "ms",
        ),
        figure(
            "turn_p50_s",
            "turn latency (post -> finished; 2 model calls = 4 s), p50",
            runs.p(turns, 50),
            "s",
        ),
        figure(
            "worker_cpu_ms_per_step",
            "worker CPU per step (all its threads)",
            cpu_used / n * 1000,
            "ms",
        ),
    ]
    leased_series = [(round(s.t - started, 2), s.leased) for s in run.samples]
    result.details = {
        "worker_ready_s": round(ready_s, 2),
        "worker_steps": n,
        "turns": len(turns),
        "steps_per_turn": round(n / max(len(turns), 1), 2),
        "wall_s": round(wall, 3),
        "posting_s": round(max(e for _, e in posts) - min(b for b, _ in posts), 3),
        "step_latency_ms": summary([x * 1000 for x in latencies]),
        "step_latency_ms_by_trigger": {
            trig: summary([lat * 1000 for r, lat in steps if r.trigger == trig])
            for trig in sorted({r.trigger for r, _ in steps})
        },
        "model_step_excess_ms": summary([x * 1000 for x in model_excess]),
        "turn_latency_s": summary(turns),
        "post_ms": summary([(e - s) * 1000 for s, e in posts]),
        "worker_cpu_s": round(cpu_used, 3),
        "worker_cpu_ms_per_step": round(cpu_used / n * 1000, 2),
        "in_flight_series": leased_series[:: max(len(leased_series) // 60, 1)],
        "pyspy": spy_file,
        **machine,
    }
    result.notes.append(
        "2 s model latency = the rules adapter's latency_s option (sleeps on the worker's asyncio loop), not a fake HTTP server."
    )
    return result
