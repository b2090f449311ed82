"""Degradation levels (runtime-mechanisms 6.3): how much of an agent's work still runs
when money, budget, the model, the queue or the workers are under pressure.

- 0 normal;
- 1 the agent's cheaper model tier and a lower output limit;
- 2 read-only tools answered from the cache where possible, non-critical tools with side
  effects deferred;
- 3 only tools marked `critical` run.

The level is the highest any single pressure calls for; thresholds come from settings.
"""

from dataclasses import dataclass

from django.conf import settings

NORMAL, CHEAPER, CACHED, CRITICAL_ONLY = 0, 1, 2, 3


@dataclass(frozen=True)
class Pressure:
    # Highest share of any budget already spent (0..1+).
    budget_used: float = 0.0
    # Credits left as a share of the owner's low-water mark; None when not metered.
    credits_left: float | None = None
    # The agent's model endpoint is cooling down after repeated failures.
    model_failing: bool = False
    # Runs waiting in the worker queue.
    queue_depth: int = 0
    # The share of live workers over their health thresholds, taking no new runs (0..1).
    workers_unhealthy: float = 0.0


def _level_for(value: float, thresholds: list[float]) -> int:
    """How many of the (rising) thresholds `value` has reached."""
    return sum(1 for t in thresholds[:3] if value >= t)


def degradation_level(pressure: Pressure) -> int:
    levels = [
        _level_for(pressure.budget_used, settings.DEGRADE_BUDGET_SHARES),
        _level_for(pressure.queue_depth, settings.DEGRADE_QUEUE_DEPTHS),
        _level_for(pressure.workers_unhealthy, settings.DEGRADE_WORKER_SHARES),
        CHEAPER if pressure.model_failing else NORMAL,
    ]
    if pressure.credits_left is not None:
        # Below the low-water mark: 1; below half of it: 2; nothing left: 3.
        left = pressure.credits_left
        levels.append(3 if left <= 0 else 2 if left < 0.5 else 1 if left < 1 else 0)
    return max(levels)
