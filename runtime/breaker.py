"""Circuit breakers shared by every worker process, kept in Redis.

Closed: calls go through and consecutive failures are counted. After
`threshold` of them (or a 429 with Retry-After) the breaker opens for a
cool-down: calls fail fast without touching the endpoint. When the cool-down
ends, exactly one caller wins the trial slot (SET NX); its success closes the
breaker, its failure opens it again.
"""

import contextlib
import time
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

import redis
from django.conf import settings


@lru_cache(maxsize=1)
def _redis() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2)


@dataclass(frozen=True)
class BreakerState:
    state: str  # closed | open | half_open
    failures: int
    open_until: float


# What this process last read of each breaker: (read at, open_until, failures).
# A closed breaker with no failures is re-read at most every LOCAL_TTL_S, so a
# healthy endpoint or tool costs no Redis round trip per call; any failure
# goes to Redis at once, and another process's opening is seen within the TTL.
LOCAL_TTL_S = 1.0
_local: dict[str, tuple[float, float, int]] = {}


class CircuitBreaker:
    def __init__(self, kind: str, *, threshold: int, cooldown_s: float) -> None:
        self.kind = kind
        self.threshold = threshold
        self.cooldown_s = cooldown_s

    def _key(self, name: str) -> str:
        return f"{settings.REDIS_KEY_PREFIX}:breaker:{self.kind}:{name}"

    def allow(self, name: str) -> bool:
        """May a call go to this endpoint now? In half-open, only one caller may."""
        key = self._key(name)
        now = time.time()
        seen = _local.get(key)
        if seen is not None and now - seen[0] < LOCAL_TTL_S and not seen[1] and not seen[2]:
            return True
        try:
            values = _redis().hmget(key, ["open_until", "failures"])
            open_until = float(values[0]) if values[0] else 0.0
            _local[key] = (now, open_until, int(values[1] or 0))
            if not open_until:
                return True
            if time.time() < open_until:
                return False
            return bool(_redis().set(key + ":trial", "1", nx=True, ex=max(int(self.cooldown_s), 1)))
        except redis.RedisError:
            return True  # without Redis we cannot share state; do not block traffic on it

    def record_success(self, name: str) -> None:
        key = self._key(name)
        seen = _local.get(key)
        if seen is not None and time.time() - seen[0] < LOCAL_TTL_S and not seen[1] and not seen[2]:
            return  # closed, and no failure to clear
        with contextlib.suppress(redis.RedisError):
            _redis().delete(key, key + ":trial")
            _local[key] = (time.time(), 0.0, 0)

    def record_failure(self, name: str, *, retry_after_s: float | None = None) -> None:
        key = self._key(name)
        _local.pop(key, None)
        try:
            pipe = _redis().pipeline()
            pipe.hincrby(key, "failures", 1)
            pipe.hget(key, "open_until")
            failures, was_open = pipe.execute()
            if int(failures) >= self.threshold or was_open or retry_after_s:
                cooldown = max(self.cooldown_s, retry_after_s or 0.0)
                open_until = time.time() + cooldown
                pipe = _redis().pipeline()
                pipe.hset(key, "open_until", str(open_until))
                pipe.expire(key, int(cooldown) + 3600)
                pipe.delete(key + ":trial")
                pipe.execute()
                # Known here at once (known_open); allow() still asks Redis while open.
                _local[key] = (time.time(), open_until, int(failures))
        except redis.RedisError:
            pass

    def known_open(self, names: Iterable[str]) -> list[str]:
        """Which of `names` this process last saw open (no Redis round trip).

        For a cheap, per-step picture of degraded services: a breaker another process
        opened shows here once this process has tried that endpoint or tool since.
        """
        now = time.time()
        found = []
        for name in names:
            seen = _local.get(self._key(name))
            if seen is not None and seen[1] > now:
                found.append(name)
        return found

    def state(self, name: str) -> BreakerState:
        try:
            values = _redis().hgetall(self._key(name))
        except redis.RedisError:
            return BreakerState("unknown", 0, 0.0)
        failures = int(values.get(b"failures", 0) or 0)
        open_until = float(values.get(b"open_until", 0) or 0)
        if not open_until:
            return BreakerState("closed", failures, 0.0)
        return BreakerState(
            "open" if time.time() < open_until else "half_open", failures, open_until
        )

    def reset(self, name: str) -> None:
        _local.pop(self._key(name), None)
        self.record_success(name)


def model_breaker() -> CircuitBreaker:
    return CircuitBreaker(
        "model",
        threshold=settings.MODEL_BREAKER_THRESHOLD,
        cooldown_s=settings.MODEL_BREAKER_COOLDOWN_S,
    )


@dataclass(frozen=True)
class OpenBreaker:
    kind: str  # model | tool
    name: str
    open_until: float


def breakers_open(*, limit: int = 50) -> list[OpenBreaker]:
    """Every breaker open now (or half-open), of any kind: one SCAN over the breaker keys
    and one pipelined read, for the admin home (not the hot path). Raises RedisError."""
    prefix = f"{settings.REDIS_KEY_PREFIX}:breaker:"
    keys = [
        k for k in _redis().scan_iter(match=prefix + "*", count=500) if not k.endswith(b":trial")
    ][: limit * 4]
    pipe = _redis().pipeline()
    for key in keys:
        pipe.hget(key, "open_until")
    found = []
    for key, value in zip(keys, pipe.execute(), strict=True):
        if not value:
            continue
        kind, _, name = key.decode()[len(prefix) :].partition(":")
        found.append(OpenBreaker(kind, name, float(value)))
    found.sort(key=lambda b: (b.kind, b.name))
    return found[:limit]
