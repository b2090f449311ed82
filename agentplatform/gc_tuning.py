"""Garbage collector set-up of a long-running server process (daphne).

Everything loaded at start-up (Django, the URL conf, DRF, the models) lives as
long as the process; `gc.freeze()` moves it to the permanent generation, so a
full collection no longer walks it. A full collection's pause then grows with
the objects of the open sockets only. `GC_LOG_PAUSES` logs each collection of
the oldest generation with its pause (the `fanout` benchmark reads those lines).
"""

import gc
import logging
import time
from typing import Any

logger = logging.getLogger("agentplatform.gc")


def freeze_after_start(*, threshold0: int) -> int:
    """Collect once, freeze what is left, and set the youngest generation's threshold;
    returns how many objects were frozen."""
    gc.collect()
    gc.freeze()
    if threshold0 > 0:
        _, threshold1, threshold2 = gc.get_threshold()
        gc.set_threshold(threshold0, threshold1, threshold2)
    return gc.get_freeze_count()


def log_pauses() -> None:
    started: dict[str, float] = {}

    def callback(phase: str, info: dict[str, Any]) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            started["t"], started["cpu"] = time.perf_counter(), time.thread_time()
            return
        pause_ms = (time.perf_counter() - started.pop("t", time.perf_counter())) * 1000
        cpu_ms = (time.thread_time() - started.pop("cpu", time.thread_time())) * 1000
        # The CPU time is what the collection itself cost; the wall time includes waiting
        # for a CPU on a busy machine.
        logger.info(
            "gc pause gen=2 ms=%.2f cpu_ms=%.2f collected=%d tracked=%d frozen=%d",
            pause_ms,
            cpu_ms,
            info["collected"],
            len(gc.get_objects(generation=2)),
            gc.get_freeze_count(),
        )

    gc.callbacks.append(callback)
