"""Worker health (runtime-mechanisms 5.1-5.2): what each worker process reports in its
heartbeat, whether it is fit to take new runs, and the step pacing the sweeper publishes.

Everything lives in Redis so that any process can read it: one key per worker
(`<prefix>:health:worker:<name>`, a JSON document with a short TTL, so a dead worker
drops out by itself) indexed by a set, and one pacing key the sweeper writes and the
runner reads. This module keeps the process's own figures (runs in flight, recent step
and model latencies, step errors) in memory; sampling them costs no I/O.
"""

import contextlib
import json
import logging
import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from typing import Any

import psutil
import redis
from django.conf import settings

logger = logging.getLogger(__name__)


@lru_cache(maxsize=1)
def _redis() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2)


def _prefix() -> str:
    return f"{settings.REDIS_KEY_PREFIX}:health"


def _worker_key(name: str) -> str:
    return f"{_prefix()}:worker:{name}"


def _index_key() -> str:
    return f"{_prefix()}:workers"


def _pacing_key() -> str:
    return f"{_prefix()}:pacing"


def percentile(values: list[float], share: float) -> float:
    """The nearest-rank percentile of `values` (0 when there are none)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    # ceil(share * n), rounded first: 0.95 * 100 is 95.00000000000001 in floating point.
    rank = max(0, min(len(ordered) - 1, math.ceil(round(share * len(ordered), 9)) - 1))
    return ordered[rank]


class Window:
    """Samples of the last `seconds`: (time, value, ok); thread-safe."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._samples: deque[tuple[float, float, bool]] = deque(maxlen=10_000)
        self._lock = threading.Lock()

    def add(self, value: float, ok: bool = True, at: float | None = None) -> None:
        with self._lock:
            self._samples.append((time.monotonic() if at is None else at, value, ok))

    def recent(self, now: float | None = None) -> list[tuple[float, float, bool]]:
        cutoff = (time.monotonic() if now is None else now) - self.seconds
        with self._lock:
            while self._samples and self._samples[0][0] < cutoff:
                self._samples.popleft()
            return list(self._samples)

    def clear(self) -> None:
        with self._lock:
            self._samples.clear()


@dataclass
class ProcessFigures:
    """What this process counts while it runs steps (one instance per process)."""

    window_s: float = 60.0
    inflight: int = 0
    steps: Window = field(init=False)
    model: Window = field(init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)

    def __post_init__(self) -> None:
        self.steps = Window(self.window_s)
        self.model = Window(self.window_s)

    def run_begin(self) -> None:
        with self._lock:
            self.inflight += 1

    def run_end(self) -> None:
        with self._lock:
            self.inflight -= 1

    def step_begin(self) -> float:
        """Start timing a step; pass the result to `step_end`."""
        return time.perf_counter()

    def step_end(self, started: float, ok: bool = True) -> None:
        """A step ended; `ok` false when it crashed in this worker. A model endpoint that
        fails is not counted: its breaker and the pacing deal with it, and pausing every
        worker for an outage upstream would stop all runs for nothing."""
        self.steps.add(time.perf_counter() - started, ok)

    def model_call_done(self, seconds: float) -> None:
        self.model.add(seconds)

    def reset(self) -> None:
        self.steps.clear()
        self.model.clear()


figures = ProcessFigures(window_s=float(getattr(settings, "WORKER_HEALTH_WINDOW_S", 60.0)))


@dataclass(frozen=True)
class Thresholds:
    """Past any of these a worker takes no new runs; 0 switches one off."""

    max_inflight: int = 0
    max_step_p95_s: float = 0.0
    max_error_rate: float = 0.0
    min_steps_for_error_rate: int = 10
    max_cpu_percent: float = 0.0
    max_rss_mb: float = 0.0

    @classmethod
    def from_settings(cls) -> "Thresholds":
        return cls(
            max_inflight=settings.WORKER_MAX_INFLIGHT,
            max_step_p95_s=settings.WORKER_MAX_STEP_P95_S,
            max_error_rate=settings.WORKER_MAX_ERROR_RATE,
            min_steps_for_error_rate=settings.WORKER_ERROR_RATE_MIN_STEPS,
            max_cpu_percent=settings.WORKER_MAX_CPU_PERCENT,
            max_rss_mb=settings.WORKER_MAX_RSS_MB,
        )


@dataclass(frozen=True)
class Report:
    """One heartbeat of one worker process."""

    name: str
    pid: int
    at: float  # wall clock
    inflight: int
    steps: int  # in the window
    step_p50_s: float
    step_p95_s: float
    error_rate: float
    model_p95_s: float
    cpu_percent: float
    rss_mb: float
    accepting: bool
    reasons: list[str]

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, raw: str | bytes) -> "Report":
        data: dict[str, Any] = json.loads(raw)
        return cls(**{k: data[k] for k in cls.__dataclass_fields__})


def over_thresholds(report: Report, limits: Thresholds) -> list[str]:
    """Why a worker with these figures should take no new runs (empty: it may)."""
    reasons: list[str] = []
    if limits.max_inflight and report.inflight > limits.max_inflight:
        reasons.append(f"{report.inflight} runs in flight > {limits.max_inflight}")
    if limits.max_step_p95_s and report.step_p95_s > limits.max_step_p95_s:
        reasons.append(f"step p95 {report.step_p95_s:.2f} s > {limits.max_step_p95_s:g} s")
    if (
        limits.max_error_rate
        and report.steps >= limits.min_steps_for_error_rate
        and report.error_rate > limits.max_error_rate
    ):
        reasons.append(f"error rate {report.error_rate:.0%} > {limits.max_error_rate:.0%}")
    if limits.max_cpu_percent and report.cpu_percent > limits.max_cpu_percent:
        reasons.append(f"CPU {report.cpu_percent:.0f}% > {limits.max_cpu_percent:g}%")
    if limits.max_rss_mb and report.rss_mb > limits.max_rss_mb:
        reasons.append(f"memory {report.rss_mb:.0f} MB > {limits.max_rss_mb:g} MB")
    return reasons


class Sampler:
    """CPU and memory of this process; CPU as the share of one core since the last sample."""

    def __init__(self) -> None:
        self._process = psutil.Process(os.getpid())
        self._process.cpu_percent(None)  # the first call only sets the reference point

    def sample(self) -> tuple[float, float]:
        return self._process.cpu_percent(None), self._process.memory_info().rss / 2**20


def report_build(
    name: str, sampler: Sampler, limits: Thresholds, source: ProcessFigures | None = None
) -> Report:
    """This process's figures now, judged against `limits`."""
    source = source or figures
    steps = source.steps.recent()
    latencies = [value for _, value, _ in steps]
    errors = sum(1 for _, _, ok in steps if not ok)
    cpu, rss = sampler.sample()
    draft = Report(
        name=name,
        pid=os.getpid(),
        at=time.time(),
        inflight=source.inflight,
        steps=len(steps),
        step_p50_s=percentile(latencies, 0.5),
        step_p95_s=percentile(latencies, 0.95),
        error_rate=errors / len(steps) if steps else 0.0,
        model_p95_s=percentile([v for _, v, _ in source.model.recent()], 0.95),
        cpu_percent=cpu,
        rss_mb=rss,
        accepting=True,
        reasons=[],
    )
    reasons = over_thresholds(draft, limits)
    return Report(**{**asdict(draft), "accepting": not reasons, "reasons": reasons})


def report_publish(report: Report, ttl_s: float) -> None:
    """Write the heartbeat (raises redis.RedisError)."""
    with _redis().pipeline(transaction=False) as pipe:
        pipe.set(_worker_key(report.name), report.to_json(), px=int(ttl_s * 1000))
        pipe.sadd(_index_key(), report.name)
        pipe.execute()


def report_withdraw(name: str) -> None:
    """A worker shutting down leaves the list at once."""
    with _redis().pipeline(transaction=False) as pipe:
        pipe.delete(_worker_key(name))
        pipe.srem(_index_key(), name)
        pipe.execute()


def reports_read() -> list[Report]:
    """The live workers' latest heartbeats, by name (a worker whose key lapsed is dropped)."""
    client = _redis()
    names = sorted(
        n.decode() if isinstance(n, bytes) else str(n) for n in client.smembers(_index_key())
    )
    if not names:
        return []
    raws = client.mget([_worker_key(n) for n in names])
    gone = [n for n, raw in zip(names, raws, strict=True) if raw is None]
    if gone:
        client.srem(_index_key(), *gone)
    return [Report.from_json(raw) for raw in raws if raw is not None]


# --- Pressure and pacing -----------------------------------------------------------

_pressure_seen: list[float] = [-1e9, 0.0]  # read at, share
PRESSURE_TTL_S = 1.0


def unhealthy_share() -> float:
    """The share of live workers taking no new runs (0..1), read at most once a second."""
    now = time.monotonic()
    if now - _pressure_seen[0] < PRESSURE_TTL_S:
        return _pressure_seen[1]
    try:
        reports = reports_read()
    except (redis.RedisError, ValueError, TypeError, KeyError):
        reports = []
    share = sum(1 for r in reports if not r.accepting) / len(reports) if reports else 0.0
    _pressure_seen[:] = [now, share]
    return share


@dataclass(frozen=True)
class Pacing:
    delay_s: float
    db_rtt_ms: float
    model_p95_s: float
    reasons: list[str]


def pacing_compute(
    *,
    db_rtt_ms: float,
    model_p95_s: float,
    db_slow_ms: float,
    model_slow_s: float,
    max_delay_s: float,
) -> Pacing:
    """The pause between a run's steps.

    None while the database and the model answer in time (0 switches a threshold
    off); past a threshold, it grows with how far past (twice the threshold: half
    of `max_delay_s`) and never exceeds `max_delay_s`. Spacing the steps asks less
    of a struggling dependency than piling more requests on it would.
    """
    ratios: list[float] = []
    reasons: list[str] = []
    if db_slow_ms and db_rtt_ms > db_slow_ms:
        ratios.append(db_rtt_ms / db_slow_ms)
        reasons.append(f"database round trip {db_rtt_ms:.0f} ms > {db_slow_ms:g} ms")
    if model_slow_s and model_p95_s > model_slow_s:
        ratios.append(model_p95_s / model_slow_s)
        reasons.append(f"model p95 {model_p95_s:.2f} s > {model_slow_s:g} s")
    if not ratios or max_delay_s <= 0:
        return Pacing(0.0, db_rtt_ms, model_p95_s, reasons)
    over = max(ratios) - 1.0  # > 0
    delay = max_delay_s * over / (over + 1.0)
    return Pacing(round(delay, 3), db_rtt_ms, model_p95_s, reasons)


def pacing_publish(pacing: Pacing, ttl_s: float) -> None:
    """Written by the sweeper; it lapses by itself when the sweeper stops (raises redis.RedisError)."""
    _redis().set(_pacing_key(), json.dumps(asdict(pacing)), px=max(1, int(ttl_s * 1000)))


def pacing_read() -> Pacing | None:
    raw = _redis().get(_pacing_key())
    if raw is None:
        return None
    data = json.loads(raw)
    return Pacing(**{k: data[k] for k in Pacing.__dataclass_fields__})


_pacing_seen: list[float] = [-1e9, 0.0]  # read at, delay
PACING_TTL_S = 1.0


def pacing_delay() -> float:
    """The pause the runner makes between steps, read at most once a second per process."""
    now = time.monotonic()
    if now - _pacing_seen[0] < PACING_TTL_S:
        return _pacing_seen[1]
    try:
        pacing = pacing_read()
    except (redis.RedisError, ValueError, TypeError, KeyError):
        pacing = None
    delay = pacing.delay_s if pacing else 0.0
    _pacing_seen[:] = [now, delay]
    return delay


def cache_reset() -> None:
    """Forget what this process read (tests, and a setting changed at run time)."""
    _pressure_seen[:] = [-1e9, 0.0]
    _pacing_seen[:] = [-1e9, 0.0]
    _host_seen.clear()


# --- The host a step runs on (the model's environment layer, runtime-mechanisms 2.3) ----

HOST_TTL_S = 1.0


@dataclass(frozen=True)
class HostLoad:
    cpu_load: float  # the 1-minute load average per core (1.0: every core busy)
    mem_available_mb: int


_host_seen: list[tuple[float, HostLoad]] = []


def host_load() -> HostLoad:
    """The host's CPU load and available memory, read at most once a second per process
    (a load average and /proc/meminfo: no sampling wait)."""
    now = time.monotonic()
    if _host_seen and now - _host_seen[0][0] < HOST_TTL_S:
        return _host_seen[0][1]
    load = HostLoad(
        cpu_load=round(os.getloadavg()[0] / (os.cpu_count() or 1), 2),
        mem_available_mb=int(psutil.virtual_memory().available / 2**20),
    )
    _host_seen[:] = [(now, load)]
    return load


def host_pressure(load: HostLoad) -> list[str]:
    """What of the host is past its threshold (ENV_HOST_CPU_HIGH, ENV_HOST_MEM_LOW_MB;
    0 turns a check off): "cpu", "memory"."""
    pressed = []
    if settings.ENV_HOST_CPU_HIGH and load.cpu_load >= settings.ENV_HOST_CPU_HIGH:
        pressed.append("cpu")
    if settings.ENV_HOST_MEM_LOW_MB and load.mem_available_mb < settings.ENV_HOST_MEM_LOW_MB:
        pressed.append("memory")
    return pressed


# --- The worker's heartbeat --------------------------------------------------------


class Monitor:
    """The heartbeat thread of one worker process.

    Every `interval_s` it builds this process's report, publishes it (TTL: three
    beats), and when the verdict changes calls `on_change(accepting)`, which the
    Celery edge turns into cancelling or re-adding the worker's run-queue consumer.
    A change is announced again on the next beats too (`repeat`): the control
    message travels through the broker, and one lost would leave a recovered
    worker idle.
    """

    def __init__(
        self,
        name: str,
        on_change: Callable[[bool], None],
        *,
        interval_s: float,
        limits: Thresholds | None = None,
        repeat: int = 3,
    ) -> None:
        self.name = name
        self.on_change = on_change
        self.interval_s = interval_s
        self.limits = limits or Thresholds.from_settings()
        self.repeat = repeat
        self.accepting = True
        self._announce = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._sampler = Sampler()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="worker-health", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.interval_s * 2 + 1)
        with contextlib.suppress(redis.RedisError):
            report_withdraw(self.name)

    def beat(self) -> Report:
        report = report_build(self.name, self._sampler, self.limits)
        if report.accepting != self.accepting:
            self.accepting = report.accepting
            self._announce = self.repeat
            if report.accepting:
                logger.info("worker %s healthy again: taking new runs", self.name)
            else:
                logger.warning(
                    "worker %s over its thresholds (%s): taking no new runs",
                    self.name,
                    "; ".join(report.reasons),
                )
        if self._announce > 0:
            self._announce -= 1
            try:
                self.on_change(self.accepting)
            except Exception:  # noqa: BLE001 - announced again on the next beat
                logger.warning("worker %s: could not switch its consumer", self.name, exc_info=True)
        report_publish(report, ttl_s=self.interval_s * 3)
        return report

    def _loop(self) -> None:
        self.beat_safely()
        while not self._stop.wait(self.interval_s):
            self.beat_safely()

    def beat_safely(self) -> None:
        try:
            self.beat()
        except Exception:  # noqa: BLE001 - a missed beat only ages the report
            logger.warning("worker %s: health beat failed", self.name, exc_info=True)


# This process's monitor when it is a Celery worker; elsewhere (in-process runs) none.
monitors: list[Monitor] = []


def accepting() -> bool:
    """May this process start a new run? (Always, unless its monitor says otherwise.)"""
    return all(m.accepting for m in monitors)
