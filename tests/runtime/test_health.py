"""Worker health: figures, thresholds, the heartbeat in Redis, the monitor's switch,
and the step pacing the runner applies."""

import threading
import time
from typing import Any

import pytest

from runtime import health


@pytest.fixture(autouse=True)
def _clean() -> Any:
    health.cache_reset()
    yield
    health.cache_reset()
    client = health._redis()
    for key in client.scan_iter(f"{health._prefix()}:*"):
        client.delete(key)


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert health.percentile(values, 0.5) == 50.0
    assert health.percentile(values, 0.95) == 95.0
    assert health.percentile([], 0.95) == 0.0
    assert health.percentile([3.0], 0.95) == 3.0


def test_the_window_forgets_old_samples() -> None:
    window = health.Window(seconds=10)
    now = time.monotonic()
    window.add(1.0, at=now - 11)
    window.add(2.0, at=now - 1)
    assert [v for _, v, _ in window.recent(now)] == [2.0]


def test_a_crashed_step_counts_as_an_error() -> None:
    figures = health.ProcessFigures(window_s=60)
    started = figures.step_begin()
    time.sleep(0.01)
    figures.step_end(started)
    figures.step_end(figures.step_begin(), ok=False)
    recent = figures.steps.recent()
    assert [ok for _, _, ok in recent] == [True, False]
    assert recent[0][1] >= 0.01


def _report(**fields: Any) -> health.Report:
    base = {
        "name": "w@host", "pid": 1, "at": time.time(), "inflight": 0, "steps": 0,
        "step_p50_s": 0.0, "step_p95_s": 0.0, "error_rate": 0.0, "model_p95_s": 0.0,
        "cpu_percent": 0.0, "rss_mb": 100.0, "accepting": True, "reasons": [],
    }  # fmt: skip
    return health.Report(**{**base, **fields})


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"inflight": 11}, "11 runs in flight > 10"),
        ({"step_p95_s": 3.5}, "step p95 3.50 s > 2 s"),
        ({"steps": 20, "error_rate": 0.6}, "error rate 60% > 50%"),
        ({"cpu_percent": 97.0}, "CPU 97% > 90%"),
        ({"rss_mb": 600.0}, "memory 600 MB > 512 MB"),
    ],
)
def test_each_threshold_stops_new_runs(fields: dict[str, Any], reason: str) -> None:
    limits = health.Thresholds(
        max_inflight=10,
        max_step_p95_s=2,
        max_error_rate=0.5,
        min_steps_for_error_rate=10,
        max_cpu_percent=90,
        max_rss_mb=512,
    )
    assert health.over_thresholds(_report(), limits) == []
    assert health.over_thresholds(_report(**fields), limits) == [reason]


def test_few_steps_do_not_make_an_error_rate_and_zero_switches_a_limit_off() -> None:
    limits = health.Thresholds(max_error_rate=0.5, min_steps_for_error_rate=10)
    assert health.over_thresholds(_report(steps=3, error_rate=1.0), limits) == []
    assert health.over_thresholds(_report(inflight=10**6, rss_mb=10**6), health.Thresholds()) == []


def test_a_report_goes_through_redis_and_lapses_with_its_worker() -> None:
    health.report_publish(_report(name="a@h", inflight=3), ttl_s=0.3)
    health.report_publish(_report(name="b@h", accepting=False, reasons=["x"]), ttl_s=30)
    reports = {r.name: r for r in health.reports_read()}
    assert reports["a@h"].inflight == 3
    assert reports["b@h"].reasons == ["x"]
    assert health.unhealthy_share() == 0.5
    time.sleep(0.4)
    assert [r.name for r in health.reports_read()] == ["b@h"]
    health.report_withdraw("b@h")
    assert health.reports_read() == []


def test_the_monitor_switches_the_consumer_on_a_change_and_repeats_the_order() -> None:
    """Figures of a real process: step latency over the limit pauses it; once the slow
    steps leave the window it takes runs again. Each change is announced `repeat` times."""
    source = health.ProcessFigures(window_s=0.5)
    switched: list[bool] = []
    monitor = health.Monitor(
        "m@h",
        switched.append,
        interval_s=0.1,
        limits=health.Thresholds(max_step_p95_s=0.05),
        repeat=2,
    )
    original = health.figures
    health.figures = source
    try:
        assert monitor.beat().accepting
        source.steps.add(0.2)
        paused = monitor.beat()
        assert not paused.accepting and paused.reasons == ["step p95 0.20 s > 0.05 s"]
        assert health.accepting()  # a monitor not registered says nothing for the process
        health.monitors.append(monitor)
        assert not health.accepting()
        monitor.beat()
        time.sleep(0.6)
        assert monitor.beat().accepting
        assert health.accepting()
        monitor.beat()
        monitor.beat()
    finally:
        health.figures = original
        health.monitors.remove(monitor)
    assert switched == [False, False, True, True]
    assert [r.name for r in health.reports_read()] == ["m@h"]
    monitor.stop()
    assert health.reports_read() == []


def test_a_report_has_this_processes_cpu_and_memory() -> None:
    sampler = health.Sampler()
    wall, cpu = time.monotonic(), time.process_time()
    while time.process_time() < cpu + 0.2:
        pass
    report = health.report_build("me", sampler, health.Thresholds(max_rss_mb=1))
    # The share of a core this process used since the sampler's start (the machine may
    # be busy, so the wall time, not the 0.2 s, is the denominator).
    expected = 100 * (time.process_time() - cpu) / (time.monotonic() - wall)
    assert report.cpu_percent >= expected / 2, (report.cpu_percent, expected)
    assert report.rss_mb > 10
    assert not report.accepting and report.reasons[0].startswith("memory ")


@pytest.mark.parametrize(
    ("db_ms", "model_s", "delay"),
    [(10, 1, 0.0), (400, 1, 1.0), (10, 90, 1.333), (1000, 1, 1.6)],
)
def test_pacing_grows_with_how_slow_the_slowest_dependency_is(
    db_ms: float, model_s: float, delay: float
) -> None:
    pacing = health.pacing_compute(
        db_rtt_ms=db_ms, model_p95_s=model_s, db_slow_ms=200, model_slow_s=30, max_delay_s=2
    )
    assert pacing.delay_s == delay
    assert bool(pacing.reasons) == bool(delay)


def test_pacing_is_read_once_a_second_and_lapses() -> None:
    health.pacing_publish(health.Pacing(0.25, 500.0, 0.0, ["db"]), ttl_s=0.5)
    assert health.pacing_delay() == 0.25
    health.pacing_publish(health.Pacing(0.75, 500.0, 0.0, ["db"]), ttl_s=0.5)
    assert health.pacing_delay() == 0.25  # remembered for PACING_TTL_S
    time.sleep(0.6)
    health.cache_reset()
    assert health.pacing_delay() == 0.0


def test_in_flight_counts_concurrent_runs() -> None:
    figures = health.ProcessFigures()
    barrier = threading.Barrier(5)

    def run() -> None:
        figures.run_begin()
        barrier.wait()
        barrier.wait()
        figures.run_end()

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    barrier.wait()
    assert figures.inflight == 4
    barrier.wait()
    for t in threads:
        t.join()
    assert figures.inflight == 0


def test_host_pressure_past_its_thresholds(settings):
    settings.ENV_HOST_CPU_HIGH, settings.ENV_HOST_MEM_LOW_MB = 2.0, 256
    assert health.host_pressure(health.HostLoad(cpu_load=1.99, mem_available_mb=256)) == []
    assert health.host_pressure(health.HostLoad(cpu_load=2.0, mem_available_mb=255)) == [
        "cpu",
        "memory",
    ]
    settings.ENV_HOST_CPU_HIGH, settings.ENV_HOST_MEM_LOW_MB = 0, 0  # off
    assert health.host_pressure(health.HostLoad(cpu_load=50.0, mem_available_mb=0)) == []


def test_the_host_is_read_at_most_once_a_second(monkeypatch):
    health.cache_reset()
    reads = []
    monkeypatch.setattr(health.os, "getloadavg", lambda: reads.append(1) or (3.0, 0, 0))
    monkeypatch.setattr(health.os, "cpu_count", lambda: 2)
    first = health.host_load()
    assert first.cpu_load == 1.5 and first.mem_available_mb > 0
    assert health.host_load() is first and len(reads) == 1
