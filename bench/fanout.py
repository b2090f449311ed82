"""Benchmark `fanout`: one frame to 500 watchers of a session, with 2,000 sockets open.

One real daphne (as the Procfile runs it) and one worker (the echo agent, so a
turn finishes); 4 sessions x 500 watchers are opened from `CLIENTS` client
processes (`bench/fanout_client.py`, the `websockets` library), each holding
a quarter of every session's watchers, so the clients are not what is timed.

- **Fan-out**: a turn is posted to one session with `services.message_post` in
  this process (its real commit, then the real publisher); each watcher stamps
  the arrival of the turn's first frame (`time.monotonic()`, one clock for all
  processes). Latency = arrival - just before the post (the commit included);
  p50 / max over every watcher of every round. The spread (last - first
  arrival of one frame) is what the fan-out itself costs.
- **Idle**: daphne's CPU time (/proc/<pid>/stat) while the 2,000 sockets sit
  idle, as a share of one core; resyncs (`WS_RESYNC_S`) happen inside the window.
- **Memory**: daphne's RSS before opening the sockets, with them open (per
  socket), and after every socket closed.
- **GC**: daphne runs with `GC_LOG_PAUSES=true`; each full collection's pause
  is read back from its log.
"""

import json
import os
import re
import subprocess
import sys
import time
from typing import Any

from . import fixtures
from .procs import Processes
from .results_model import Result, figure
from .runs import MachineLoad, process_cpu_s
from .stats import percentile, summary

SESSIONS = 4
WATCHERS = 500
CLIENTS = 4
GC_LINE = re.compile(
    r"gc pause gen=2 ms=([\d.]+) cpu_ms=([\d.]+) collected=(\d+) tracked=(\d+) frozen=(\d+)"
)


def _rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


class _Client:
    def __init__(self, ws_base: str, spec: list[list[Any]]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.fanout_client", ws_base, json.dumps(spec)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )

    def line(self) -> str:
        assert self.proc.stdout is not None
        out = self.proc.stdout.readline()
        if not out:
            raise RuntimeError(f"fanout client exited with {self.proc.wait()}")
        return out.strip()

    def send(self, command: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)


def _dump(clients: list[_Client]) -> tuple[list[list[Any]], list[str]]:
    frames: list[list[Any]] = []
    failures: list[str] = []
    for client in clients:
        client.send("dump")
    for number, client in enumerate(clients):
        data = json.loads(client.line())
        # Socket numbers are per client process.
        frames.extend([number * 1_000_000 + f[0], *f[1:]] for f in data["frames"])
        failures.extend(data["failures"])
    return frames, failures


def run(
    procs: Processes,
    *,
    rounds: int,
    idle_s: float,
    watchers: int = WATCHERS,
    settle_s: float = 5.0,
) -> Result:
    from django.db import connection

    from record.models import Session
    from sessions import services

    result = Result(
        name="fanout",
        title=f"websocket fan-out: {SESSIONS} sessions x {watchers} watchers on one daphne",
        params={
            "sessions": SESSIONS,
            "watchers_per_session": watchers,
            "client_processes": CLIENTS,
            "rounds": rounds,
            "idle_s": idle_s,
            "settle_s_before_rss_after_close": settle_s,
            "agent": "bench-echo",
        },
    )
    base_env = procs.env
    procs.env = {**base_env, "GC_LOG_PAUSES": "true", "WS_MAX_SOCKETS_PER_KEY": "0"}
    try:
        port = procs.start_web()
    finally:
        procs.env = base_env
    node = procs.start_worker("worker", concurrency=8)
    procs.wait_web()
    procs.wait_worker("worker", node)
    web_pid = procs.procs["web"].pid
    keys = [fixtures.api_key(f"bench-fanout-{i}") for i in range(SESSIONS)]
    ids = [
        str(fixtures.sessions_create("bench-echo", 1, username=f"bench-fanout-{i}")[0].pk)
        for i in range(SESSIONS)
    ]
    connection.close()
    time.sleep(1.0)
    rss_before = _rss_kb(web_pid)

    per_client = watchers // CLIENTS
    ws_base = f"ws://127.0.0.1:{port}"
    clients: list[_Client] = []
    try:
        t_open = time.monotonic()
        for _ in range(CLIENTS):
            spec = [[sid, keys[i], per_client] for i, sid in enumerate(ids)]
            clients.append(_Client(ws_base, spec))
        opened = 0
        problems: list[str] = []
        for client in clients:
            ready = client.line().split(" ", 2)
            opened += int(ready[1])
            problems.extend(json.loads(ready[2]))
        open_s = time.monotonic() - t_open
        if opened != SESSIONS * watchers:
            raise RuntimeError(
                f"only {opened} of {SESSIONS * watchers} sockets opened: {problems[:3]}\n"
                + procs.log_tail("web", 10)
            )
        time.sleep(min(2.0, settle_s))
        _dump(clients)  # the replay frames of `?after=0`
        rss_open = _rss_kb(web_pid)

        # Idle: nothing is published; only pings and resyncs run.
        load = MachineLoad()
        load.start()
        cpu0, t0 = process_cpu_s(web_pid), time.monotonic()
        time.sleep(idle_s)
        idle_cpu = process_cpu_s(web_pid) - cpu0
        idle_wall = time.monotonic() - t0
        idle_machine = load.stop()
        idle_frames, _ = _dump(clients)

        # Fan-out rounds, one session after the other.
        latencies: list[float] = []
        from_return: list[float] = []
        spreads: list[float] = []
        to_first: list[float] = []
        post_ms: list[float] = []
        delivered = 0  # frames the watchers got during the rounds (every socket's count)
        load = MachineLoad()
        load.start()
        fan_cpu0 = process_cpu_s(web_pid)
        seen: dict[str, int] = {}  # session -> highest seq any watcher got
        late = 0
        for r in range(rounds):
            sid = ids[r % SESSIONS]
            session = Session.objects.get(pk=sid)
            before = seen.get(sid, 0)
            started = time.monotonic()
            services.message_post(session=session, content=f"fan-out round {r}")
            returned = time.monotonic()
            connection.close()
            first: dict[int, float] = {}
            deadline = started + 30
            while time.monotonic() < deadline:
                time.sleep(0.5)
                frames, _ = _dump(clients)
                delivered += len(frames)
                for index, fsid, seq, _type, at in frames:
                    if seq is None:
                        continue
                    seen[fsid] = max(seen.get(fsid, 0), seq)
                    if fsid == sid and seq > before and index not in first:
                        first[index] = at
                if len(first) == watchers:
                    break
            late += watchers - len(first)
            arrivals = list(first.values())
            if not arrivals:
                raise RuntimeError(f"round {r}: no watcher got a frame within 30 s")
            latencies.extend((a - started) * 1000 for a in arrivals)
            from_return.extend((a - returned) * 1000 for a in arrivals)
            spreads.append((max(arrivals) - min(arrivals)) * 1000)
            to_first.append((min(arrivals) - started) * 1000)
            post_ms.append((returned - started) * 1000)
            time.sleep(1.0)  # the rest of the turn (the worker's step) passes
            rest = _dump(clients)[0]
            delivered += len(rest)
            for _index, fsid, seq, _type, _at in rest:
                if seq is not None:
                    seen[fsid] = max(seen.get(fsid, 0), seq)
        # Over the rounds' whole window (their 1 s pauses' pings and resyncs included).
        fan_cpu = process_cpu_s(web_pid) - fan_cpu0
        fan_machine = load.stop()

        for client in clients:
            client.send("close")
        for client in clients:
            client.line()
    finally:
        for client in clients:
            client.stop()
    time.sleep(settle_s)  # freed memory returns to the OS before RSS is read
    rss_closed = _rss_kb(web_pid)
    procs.stop("web")  # flushes its log
    gc_pauses = [
        (float(m[1]), int(m[4]), int(m[5]), float(m[2]))
        for m in GC_LINE.finditer(procs.logs["web"].read_text(errors="replace"))
    ]
    pause_ms = [p[0] for p in gc_pauses]
    pause_cpu_ms = [p[3] for p in gc_pauses]

    idle_core_pct = 100.0 * idle_cpu / idle_wall
    per_socket_kb = (rss_open - rss_before) / (SESSIONS * watchers)
    result.figures = [
        figure(
            "fanout_p50_ms",
            f"post -> frame at each of {watchers} watchers, p50",
            percentile(latencies, 50),
            "ms",
            le=50,
        ),
        figure(
            "fanout_max_ms",
            f"post -> frame at each of {watchers} watchers, max",
            max(latencies) if not late else float("nan"),
            "ms",
            le=150,
        ),
        figure(
            "fanout_spread_p50_ms",
            "first -> last watcher of one frame, p50",
            percentile(spreads, 50),
            "ms",
        ),
        figure(
            "fanout_first_p50_ms",
            "post -> first watcher of a frame, p50",
            percentile(to_first, 50),
            "ms",
        ),
        figure(
            "fanout_cpu_per_frame_us",
            "daphne CPU per frame delivered to one socket",
            1e6 * fan_cpu / max(delivered, 1),
            "us",
        ),
        figure(
            "idle_core_pct",
            f"daphne CPU, {SESSIONS * watchers} idle sockets",
            idle_core_pct,
            "% core",
            le=2,
        ),
        figure("rss_per_socket_kb", "daphne RSS per open socket", per_socket_kb, "KB", le=40),
        figure(
            "rss_after_close_mb", "daphne RSS after every socket closed", rss_closed / 1024, "MB"
        ),
        figure(
            "gc_full_pause_max_ms",
            "daphne full GC pause, max (wall)",
            max(pause_ms, default=0.0),
            "ms",
        ),
        figure(
            "gc_full_pause_cpu_max_ms",
            "daphne full GC pause, max (CPU)",
            max(pause_cpu_ms, default=0.0),
            "ms",
        ),
    ]
    result.details = {
        "latency_from_post_ms": summary(latencies),
        "latency_from_post_return_ms": summary(from_return),
        "spread_ms": summary(spreads),
        "to_first_watcher_ms": summary(to_first),
        "fanout_cpu_s": round(fan_cpu, 3),
        "frames_delivered": delivered,
        "watchers_without_frame_in_30s": late,
        "message_post_ms": summary(post_ms),
        "open_s": round(open_s, 2),
        "idle": {
            "cpu_s": round(idle_cpu, 3),
            "wall_s": round(idle_wall, 2),
            "frames_received": len(idle_frames),
            **idle_machine,
        },
        "fanout_machine": fan_machine,
        "rss_kb": {"before": rss_before, "open": rss_open, "closed": rss_closed},
        "gc_full_collections": len(gc_pauses),
        "gc_pause_ms": summary(pause_ms),
        "gc_pause_cpu_ms": summary(pause_cpu_ms),
        "gc_tracked_objects_max": max((p[1] for p in gc_pauses), default=0),
        "gc_frozen_objects": max((p[2] for p in gc_pauses), default=0),
        "web_env": {
            k: procs.env.get(k, os.environ.get(k, ""))
            for k in ("GC_FREEZE", "GC_THRESHOLD0", "WS_RESYNC_S", "FEED_RESTART_S")
        },
    }
    result.notes.append(
        "Latency runs from just before message_post (its commit included) to each watcher's "
        "arrival of the turn's first frame; idle CPU is daphne's utime+stime over the idle window."
    )
    return result
