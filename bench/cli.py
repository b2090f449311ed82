"""`python -m bench [--quick] [--only NAME ...]`: run the benchmarks, print, save, update the README."""

import argparse
import os
import resource
import signal
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Any

from . import environment

BENCHMARKS = (
    "engine",
    "langgraph",
    "workflow",
    "checkpoint",
    "tools",
    "adapters",
    "worker",
    "e2e",
    "approvals",
    "inflight",
    "recovery",
    "fanout",
    "load",
    "sustained",
    "http",
    "billing",
    "context",
    "memory",
)


@dataclass(frozen=True)
class Sizes:
    engine_sessions: int
    engine_turns: int
    engine_warmup: int
    worker_sessions: int
    e2e_sessions: int
    e2e_turns: int
    inflight_sessions: int
    checkpoint_demo_sessions: int
    checkpoint_cycles: int
    checkpoint_insert_reps: int
    tools_executor_reps: int
    tools_sessions: int
    adapters_reps: int
    adapters_paced_reps: int
    recovery_kills: int
    recovery_standby_kills: int
    fanout_rounds: int
    fanout_idle_s: float
    load_sessions: int
    http_seconds: float
    http_layouts: tuple[int, ...]  # WEB_PROCESSES values compared
    sustained_rates: tuple[float, ...] = (10, 20, 40, 60, 80)
    sustained_seconds: float = 60.0
    langgraph_runs: int = 40
    billing_gate_reps: int = 300
    billing_ranking_reps: int = 10
    approvals_samples: int = 30
    billing_ab_cycles: int = 1200
    context_steps: int = 200
    fanout_watchers: int = 500  # per session, of 4: 2,000 sockets
    # Pauses before daphne's RSS is read: after the sockets open (at most 2 s), after they close.
    fanout_settle_s: float = 5.0
    load_warmup: int = 4
    memory_items: int = 100_000
    memory_queries: int = 300
    memory_large_owners: int = 4
    memory_large_items: int | None = None  # None: max(items / 20, 2 x MEMORY_EXACT_SCAN_MAX)
    # Seconds of machine-load sampling before each benchmark (with the reference loop).
    background_sample_s: float = 1.0


FULL = Sizes(
    engine_sessions=20,
    engine_turns=5,
    engine_warmup=3,
    worker_sessions=100,
    e2e_sessions=10,
    e2e_turns=10,
    inflight_sessions=200,
    checkpoint_demo_sessions=6,
    checkpoint_cycles=400,
    checkpoint_insert_reps=500,
    tools_executor_reps=300,
    tools_sessions=40,
    adapters_reps=40,
    adapters_paced_reps=4,
    recovery_kills=20,
    recovery_standby_kills=10,
    fanout_rounds=12,
    fanout_idle_s=45.0,
    load_sessions=200,
    http_seconds=10.0,
    http_layouts=(1, 2),
)
QUICK = Sizes(
    engine_sessions=5,
    engine_turns=3,
    engine_warmup=2,
    worker_sessions=20,
    e2e_sessions=3,
    e2e_turns=5,
    inflight_sessions=200,
    checkpoint_demo_sessions=2,
    checkpoint_cycles=100,
    checkpoint_insert_reps=150,
    tools_executor_reps=100,
    tools_sessions=8,
    adapters_reps=10,
    adapters_paced_reps=1,
    recovery_kills=1,
    recovery_standby_kills=0,
    fanout_rounds=2,
    fanout_idle_s=3.0,
    fanout_settle_s=1.0,
    fanout_watchers=128,
    langgraph_runs=8,
    load_sessions=30,
    load_warmup=0,
    http_seconds=1.0,
    http_layouts=(2,),
    billing_gate_reps=100,
    billing_ranking_reps=5,
    approvals_samples=5,
    billing_ab_cycles=60,
    context_steps=50,
    sustained_rates=(10,),
    sustained_seconds=3.0,
    memory_items=10_000,
    memory_queries=60,
    memory_large_owners=1,
    memory_large_items=6_000,
    background_sample_s=0.2,
)
# Processes a benchmark hands on to the next one when that one starts them alike (the
# Procfile's lines, same environment); `load` leaves every turn finished.
_PROCFILE_WORKERS = {"worker1", "worker2", "beat"}
SHARED: dict[str, set[str]] = {
    # The same 100-thread worker (`worker` leaves its queue consumed), then daphne too;
    # e2e's beat stops.
    "worker": {"worker"},
    "e2e": {"web", "worker"},
    "approvals": {"web", "worker"},
    "load": {"model", "web", *_PROCFILE_WORKERS},
    "sustained": {"model", "web", *_PROCFILE_WORKERS},
    "http": _PROCFILE_WORKERS,
}
# What `--quick` does not measure, said in its output and its JSON (nothing is skipped silently).
QUICK_LEAVES_OUT: dict[str, str] = {
    "adapters": "the paced series' warm-up streams (the burst series warmed the same code up)",
    "recovery": "no standby series (kills with a second worker running); 1 kill, not 20 "
    "(its p50 is its p95)",
    "fanout": "4 x 128 watchers (512 sockets), not 4 x 500: the per-socket, idle-CPU and "
    "500-watcher latency targets are checked at a quarter of their load",
    "load": "30 users at once, not 200, and no warm-up turns first (the 202s include "
    "the processes' first requests)",
    "sustained": "one rate (10 turns/s for 3 s), not 10-80/s for 60 s each: max_rate is at most 10",
    "http": "the 2-daphne layout only (not WEB_PROCESSES=1); 1 s a measure, not 10",
    "memory": "10,000 items and 1 large owner of 6,000, not 100,000 and 4 of 10,000",
}


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smaller counts: a smoke run in under 2 minutes on an idle 2-core machine",
    )
    parser.add_argument(
        "--only",
        action="append",
        choices=BENCHMARKS,
        metavar="NAME",
        help=f"run only this benchmark (repeatable): {', '.join(BENCHMARKS)}",
    )
    parser.add_argument(
        "--readme",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="rewrite bench/FIGURES.md with this run's figures (default: only on a full run)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="cProfile the engine and workflow benchmarks; writes bench/results/engine-<ts>.pstats "
        "and workflow-<ts>.pstats",
    )
    parser.add_argument(
        "--pyspy",
        action="store_true",
        help="sample the measured windows with py-spy (GIL holders); collapsed stacks in bench/results/",
    )
    parser.add_argument(
        "--wait-quiet",
        type=float,
        default=0,
        metavar="SECONDS",
        help="before each benchmark, wait up to SECONDS for other processes to leave the CPUs "
        "(under 25%% busy); for shared machines",
    )
    parser.add_argument(
        "--worker-concurrency",
        type=int,
        default=100,
        help="threads of the worker in the worker and e2e benchmarks (default 100, as the Procfile)",
    )
    parser.add_argument(
        "--inflight-concurrency",
        type=int,
        default=250,
        help="threads of the worker in the in-flight benchmark (default 250)",
    )
    parser.add_argument(
        "--inflight-workers",
        type=int,
        default=1,
        help="worker processes in the in-flight benchmark, sharing --inflight-concurrency threads (default 1)",
    )
    parser.add_argument(
        "--post-live",
        action="store_true",
        help="worker and inflight: post the turns while the worker runs, instead of pausing its "
        "queue while posting and then releasing it",
    )
    parser.add_argument(
        "--memory-items",
        type=int,
        default=None,
        help="memory benchmark: items over 1,000 owners (default 100,000, quick 10,000; "
        "1000000 for the large case, which takes long to build)",
    )
    parser.add_argument(
        "--memory-large-items",
        type=int,
        default=None,
        help="memory benchmark, skewed case: items of each of the 4 large owners (default "
        "max(items / 20, 2 x MEMORY_EXACT_SCAN_MAX): 50,000 at 1,000,000 items)",
    )
    parser.add_argument(
        "--memory-data",
        choices=("lowrank", "random"),
        default="lowrank",
        help="memory benchmark: 'lowrank' (intrinsic dimension 16 + noise, like real "
        "embeddings; default) or 'random' (isotropic gaussian, the worst case for HNSW)",
    )
    parser.add_argument(
        "--memory-dims",
        type=int,
        default=256,
        help="memory benchmark: vector dimension (default 256, the offline embedder's)",
    )
    parser.add_argument(
        "--sustained-rates",
        type=lambda text: tuple(float(v) for v in text.split(",")),
        default=None,
        metavar="R1,R2,...",
        help="sustained benchmark: the rates tried, turns/s (default 10,20,40,60,80; quick 10)",
    )
    parser.add_argument(
        "--sustained-seconds",
        type=float,
        default=None,
        help="sustained benchmark: seconds of arrivals per rate (default 60; quick 3)",
    )
    parser.add_argument(
        "--worker-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra environment for the processes the benchmarks start, e.g. DB_POOL_MAX=50",
    )
    return parser.parse_args(argv)


def _raise_on_signal(signum: int, _frame: Any) -> None:
    from .procs import stop_everything

    stop_everything()
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    sizes = QUICK if args.quick else FULL
    selected = [b for b in BENCHMARKS if not args.only or b in args.only]
    extra_env = dict(item.split("=", 1) for item in args.worker_env)
    signal.signal(signal.SIGTERM, _raise_on_signal)
    signal.signal(signal.SIGINT, _raise_on_signal)
    queue = f"bench-{os.getpid()}"
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    started = time.perf_counter()

    with environment.exclusive():
        background = _background_load(sizes.background_sample_s)
        if background["busy_pct"] > 25:
            print(
                f"bench: WARNING the machine is busy before the run ({background['busy_pct']:.0f}% of all CPUs, "
                f"load average {background['loadavg_1m']:.2f}); the figures will be pessimistic",
                flush=True,
            )
        env, recreate_s = environment.prepare(queue)
        os.environ.update(extra_env)
        print(
            f"bench: database {environment.BENCH_DB} recreated in {recreate_s:.2f} s"
            f"{' from its migrated template' if environment.copied_from_template() else ''}; "
            f"queue {queue}",
            flush=True,
        )
        migrate_s = environment.django_setup()
        print(f"bench: django set up and migrated in {migrate_s:.1f} s", flush=True)

        from . import fixtures, report
        from .procs import STOP, Processes

        fixtures.install()
        procs = Processes({**env, **extra_env})
        if args.pyspy:
            procs.pyspy_prefix = str(environment.ROOT / "bench" / "results" / f"pyspy-{stamp}")
        results = []
        try:
            for position, name in enumerate(selected):
                if STOP.is_set():
                    raise KeyboardInterrupt("stopping")
                quiet = _wait_quiet(args.wait_quiet, sample_s=sizes.background_sample_s)
                failed = True  # until it returns: a failed benchmark's processes all stop
                print(
                    f"bench: machine {quiet['busy_pct']:.0f}% busy before {name} "
                    f"(CPU reference loop {quiet['cpu_reference_ms']} ms)",
                    flush=True,
                )
                print(f"bench: running {name} ...", flush=True)
                t0 = time.perf_counter()
                cpu0 = _cpu_s()
                try:
                    result = _run_one(name, sizes, args, procs, stamp, results)
                    failed = bool(result.error)
                except KeyboardInterrupt:
                    raise
                except Exception as exc:  # noqa: BLE001 - report it, run the rest
                    from .results_model import Result

                    traceback.print_exc()
                    result = Result(name=name, title=name, error=f"{type(exc).__name__}: {exc}")
                finally:
                    following = selected[position + 1] if position + 1 < len(selected) else ""
                    if failed:
                        following = ""
                    # Processes both benchmarks start alike run on (their start-up is ~1/3
                    # of each on 2 cores); the rest stop.
                    procs.stop_all(keep=SHARED.get(name, set()) & SHARED.get(following, set()))
                    _purge_queue(queue, everything=False)
                result.seconds = time.perf_counter() - t0
                result.details["background_before"] = quiet
                # Processes handed on to the next benchmark count there (when they stop).
                result.details["cpu_s_bench_and_its_processes"] = round(_cpu_s() - cpu0, 1)
                if args.quick and name in QUICK_LEAVES_OUT:
                    result.notes.append(f"--quick leaves out: {QUICK_LEAVES_OUT[name]}")
                results.append(result)
                print(report.result_lines(result), flush=True)
                if args.quick and name in QUICK_LEAVES_OUT:
                    print(f"    (--quick leaves out: {QUICK_LEAVES_OUT[name]})", flush=True)
        except KeyboardInterrupt:
            print("bench: interrupted; stopping processes", file=sys.stderr)
            procs.stop_all()
            _purge_queue(queue)
            return 130
        finally:
            procs.stop_all()
        _purge_queue(queue)

        total = time.perf_counter() - started
        print(_time_per_part(results, setup_s=recreate_s + migrate_s), flush=True)
        doc = report.document(
            results,
            args=vars(args),
            stamp=stamp,
            seconds=total,
            setup={
                "recreate_s": round(recreate_s, 2),
                "migrate_s": round(migrate_s, 2),
                "background_load_before_run": background,
            },
        )
        print()
        print(report.table(results))
        paths = report.save(doc, stamp)
        print(f"\nbench: wrote {', '.join(str(p) for p in paths)} ({total:.0f} s in all)")
        complete = not args.quick and not args.only and not any(r.error for r in results)
        update_readme = args.readme if args.readme is not None else complete
        if update_readme:
            report.readme_update(doc)
            print("bench: updated the figures in bench/FIGURES.md")
        else:
            print(
                "bench: bench/FIGURES.md left alone (only a full run without errors rewrites it;"
                " --readme forces it)"
            )
    failed = [r.name for r in results if r.error]
    return 1 if failed else 0


def _run_one(
    name: str,
    sizes: Sizes,
    args: argparse.Namespace,
    procs: Any,
    stamp: str,
    done: list[Any],
) -> Any:
    if name == "engine":
        from . import engine_step

        profile = (
            str(environment.ROOT / "bench" / "results" / f"engine-{stamp}.pstats")
            if args.profile
            else None
        )
        return engine_step.run(
            sessions=sizes.engine_sessions,
            turns=sizes.engine_turns,
            warmup_turns=sizes.engine_warmup,
            profile_path=profile,
            spy=procs.spy,
        )
    if name == "langgraph":
        from . import langgraph_compare

        return langgraph_compare.run(runs=sizes.langgraph_runs)
    if name == "workflow":
        from . import workflow_compare

        return workflow_compare.run(
            runs=sizes.langgraph_runs,
            # The agent loop's step overhead, if the engine benchmark ran before this one.
            engine=next((r for r in done if r.name == "engine"), None),
            profile_path=(
                str(environment.ROOT / "bench" / "results" / f"workflow-{stamp}.pstats")
                if args.profile
                else None
            ),
        )
    if name == "worker":
        from . import worker_rate

        return worker_rate.run(
            procs,
            sessions=sizes.worker_sessions,
            concurrency=args.worker_concurrency,
            live=args.post_live,
        )
    if name == "e2e":
        from . import e2e_latency

        return e2e_latency.run(
            procs,
            sessions=sizes.e2e_sessions,
            turns=sizes.e2e_turns,
            concurrency=args.worker_concurrency,
        )
    if name == "inflight":
        from . import in_flight

        return in_flight.run(
            procs,
            sessions=sizes.inflight_sessions,
            concurrency=args.inflight_concurrency,
            workers=args.inflight_workers,
            live=args.post_live,
        )
    if name == "memory":
        from . import memory_search

        return memory_search.run(
            items=args.memory_items or sizes.memory_items,
            dims=args.memory_dims,
            queries=sizes.memory_queries,
            large_owners=sizes.memory_large_owners,
            large_items=args.memory_large_items or sizes.memory_large_items,
            data=args.memory_data,
        )
    if name == "checkpoint":
        from . import checkpoint

        return checkpoint.run(
            demo_sessions=sizes.checkpoint_demo_sessions,
            demo_turns=2,
            cycles=sizes.checkpoint_cycles,
            insert_reps=sizes.checkpoint_insert_reps,
        )
    if name == "tools":
        from . import tool_dispatch

        return tool_dispatch.run(
            executor_reps=sizes.tools_executor_reps, sessions=sizes.tools_sessions
        )
    if name == "adapters":
        from . import adapters

        return adapters.run(
            procs,
            reps=sizes.adapters_reps,
            paced_reps=sizes.adapters_paced_reps,
            paced_warmup=not args.quick,
        )
    if name == "approvals":
        from . import approvals

        return approvals.run(
            procs, sessions=sizes.approvals_samples, concurrency=args.worker_concurrency
        )
    if name == "recovery":
        from . import recovery

        return recovery.run(
            procs, kills=sizes.recovery_kills, standby_kills=sizes.recovery_standby_kills
        )
    if name == "fanout":
        from . import fanout

        return fanout.run(
            procs,
            rounds=sizes.fanout_rounds,
            idle_s=sizes.fanout_idle_s,
            watchers=sizes.fanout_watchers,
            settle_s=sizes.fanout_settle_s,
        )
    if name == "load":
        from . import load

        return load.run(procs, sessions=sizes.load_sessions, warmup=sizes.load_warmup)
    if name == "sustained":
        from . import sustained

        return sustained.run(
            procs,
            rates=args.sustained_rates or sizes.sustained_rates,
            seconds=args.sustained_seconds or sizes.sustained_seconds,
            keep_going=args.sustained_rates is not None,
        )
    if name == "http":
        from . import http_serving

        return http_serving.run(procs, seconds=sizes.http_seconds, layouts=sizes.http_layouts)
    if name == "context":
        from . import context

        return context.run(steps=sizes.context_steps)
    if name == "billing":
        from . import billing

        return billing.run(
            gate_reps=sizes.billing_gate_reps,
            ranking_reps=sizes.billing_ranking_reps,
            ab_cycles=sizes.billing_ab_cycles,
        )
    raise ValueError(name)


def _cpu_s() -> float:
    """CPU seconds of this process and of its children that have exited (the processes
    the benchmarks started and stopped); the database and Redis servers not included."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _time_per_part(results: list[Any], *, setup_s: float) -> str:
    """Where the run's time went, with the CPU it used and the load it met: on a shared
    machine, what an idle one would take can be inferred from these."""
    parts = [f"setup {setup_s:.1f} s"]
    for r in results:
        cpu = r.details.get("cpu_s_bench_and_its_processes")
        load = r.details.get("background_before", {}).get("loadavg_1m")
        parts.append(f"{r.name} {r.seconds:.1f} s (CPU {cpu} s, load {load})")
    return "bench: time per part: " + "; ".join(parts)


def _background_load(seconds: float = 1.0) -> dict[str, float]:
    """How busy the machine is before the benchmark starts anything (other people's work)."""
    from .runs import MachineLoad

    load = MachineLoad()
    load.start()
    time.sleep(seconds)
    busy = load.stop()["machine_cpu_busy_pct"] or 0.0
    return {"busy_pct": busy, "loadavg_1m": round(os.getloadavg()[0], 2)}


def cpu_reference_ms() -> float:
    """A fixed pure-Python loop, best of 3, in CPU ms: how fast this CPU runs Python right now.

    About 30-60 ms on a quiet machine; it grows when other processes share the
    cores (hyperthreads, a busy host), and CPU-time figures grow with it.
    """
    best = float("inf")
    for _ in range(3):
        started = time.thread_time()
        total = 0
        for i in range(300_000):
            total += i * i % 7
        best = min(best, (time.thread_time() - started) * 1000)
    return round(best, 1)


def _wait_quiet(limit_s: float, threshold: float = 25.0, sample_s: float = 1.0) -> dict[str, float]:
    deadline = time.monotonic() + limit_s
    while True:
        load = _background_load(sample_s)
        if load["busy_pct"] < threshold or time.monotonic() >= deadline:
            load["cpu_reference_ms"] = cpu_reference_ms()
            return load


def _purge_queue(queue: str, everything: bool = True) -> None:
    """Drop the tasks left on the bench queue (benchmark 1 enqueues runs no worker takes).

    Between benchmarks only the queue's lists go (kombu's `queue` and
    `queue\x06\x16<priority>` keys); at the end its binding keys too.
    """
    try:
        import redis
        from django.conf import settings

        client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=3)
        if everything:
            keys = list(client.scan_iter(match=f"*{queue}*", count=500))
        else:
            keys = [queue, *client.scan_iter(match=f"{queue}\x06\x16*", count=500)]
        if keys:
            client.delete(*keys)
        client.close()
    except Exception as exc:  # noqa: BLE001
        print(f"bench: could not purge queue {queue}: {exc}", file=sys.stderr)
