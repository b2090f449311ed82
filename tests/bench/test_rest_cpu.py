"""bench/rest_cpu.py: a round's server CPU is charged to its requests (the server's
clock ticks only resolve a round's total)."""

import asyncio
import math
import os
import time

from bench.rest_cpu import _measure


def _busy_call(status: int, busy_s: float):
    async def call() -> tuple[int, bytes]:
        deadline = time.process_time() + busy_s
        while time.process_time() < deadline:
            pass
        return status, b""

    return call


def test_the_server_cpu_of_a_round_is_shared_by_its_requests():
    # This process stands in for the server: 10 requests of 30 ms of CPU each.
    figures = asyncio.run(_measure([_busy_call(202, 0.03)] * 10, 202, os.getpid()))
    assert figures["n"] == 10
    assert 25 <= figures["database_cpu_ms_mean"] <= 60, figures
    assert 25 <= figures["cpu_ms_p50"] <= 60, figures


def test_without_a_server_on_this_machine_its_share_is_unknown():
    figures = asyncio.run(_measure([_busy_call(200, 0.0)] * 3, 200, None))
    assert math.isnan(figures["database_cpu_ms_mean"])
