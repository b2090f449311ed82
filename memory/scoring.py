"""How memory items rank before a turn: similarity x time decay x importance.

Pure functions, so the ranking is unit-tested without a database.
"""

import math
from datetime import datetime

DEFAULT_HALF_LIFE_DAYS = 30.0


def time_decay(age_days: float, half_life_days: float = DEFAULT_HALF_LIFE_DAYS) -> float:
    """1.0 when fresh, 0.5 after one half-life; never below 0.1, so an old preference still counts."""
    if half_life_days <= 0:
        return 1.0
    return max(0.1, math.pow(0.5, max(0.0, age_days) / half_life_days))


def importance_weight(importance: float) -> float:
    """0.5 for an unimportant item, 1.0 for the most important: importance ranks, never erases."""
    return 0.5 + 0.5 * min(1.0, max(0.0, importance))


def memory_score(
    *,
    similarity: float,
    used_at: datetime,
    now: datetime,
    importance: float,
    half_life_days: float = DEFAULT_HALF_LIFE_DAYS,
) -> float:
    age_days = (now - used_at).total_seconds() / 86400
    return (
        max(0.0, similarity) * time_decay(age_days, half_life_days) * importance_weight(importance)
    )
