"""When the sweeper last completed, kept in Redis so /readyz on any web process can tell.

Without a sweep, a dead worker's runs are never taken over and due timers never
fire, while every other probe stays green; readyz reports the age of the last one.
"""

import functools
import time

import redis
from django.conf import settings

# Long enough to outlive any sensible SWEEPER_STALE_S; short enough that a
# deployment that was removed leaves nothing behind for long.
_TTL_S = 24 * 3600


@functools.cache
def _client(url: str) -> redis.Redis:
    # One pool per process: the sweeper records a completion every half second.
    return redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)


def _key() -> str:
    return f"{settings.REDIS_KEY_PREFIX}:sweeper:last_completed"


def sweep_mark_completed(*, at: float | None = None) -> None:
    """Record a completed sweep (wall-clock seconds); raises redis.RedisError."""
    _client(settings.REDIS_URL).set(_key(), repr(time.time() if at is None else at), ex=_TTL_S)


def _slot_key() -> str:
    return f"{settings.REDIS_KEY_PREFIX}:sweeper:slot"


def sweep_slot_take(*, interval_s: float) -> bool:
    """Whether a scheduled sweep should run now: False when another one ran this interval.

    Beat may run on every worker host (so that losing one host does not stop the
    takeovers); each sends a sweep every interval. The first sweep of an interval takes
    the slot for most of it (80 %), so N beats cost one sweep per interval, not N,
    and a sweep is never skipped for longer than that. Without Redis, sweep anyway:
    a sweep is correct whoever else runs one (its claims are conditional updates).
    """
    try:
        return bool(
            _client(settings.REDIS_URL).set(
                _slot_key(), "1", nx=True, px=max(int(interval_s * 800), 1)
            )
        )
    except redis.RedisError:
        return True


def sweep_age_s() -> float | None:
    """Seconds since the last completed sweep, or None if none is recorded; raises redis.RedisError."""
    value = _client(settings.REDIS_URL).get(_key())
    if value is None:
        return None
    return max(time.time() - float(value), 0.0)
