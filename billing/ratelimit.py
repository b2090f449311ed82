"""Calls and tokens per minute per owner, per tool and per model endpoint, shared by every
worker process through Redis.

One Lua script checks and counts both figures of a fixed one-minute window atomically, so
two processes can never both take the last slot. A call over either limit is not counted
and learns how long until the window turns. Redis being down lets calls through (the
limits protect upstream quotas; they must not stop the platform).
"""

import logging
import math
import time
from dataclasses import dataclass
from functools import lru_cache

import redis
from django.conf import settings

logger = logging.getLogger(__name__)

WINDOW_S = 60

# KEYS: calls counter, tokens counter. ARGV: calls limit, tokens limit, this call's tokens,
# expiry. A single call bigger than the whole token limit runs alone in an empty window
# (otherwise it could never run); 0 means no limit.
_TAKE = """
local calls = tonumber(redis.call('GET', KEYS[1]) or '0')
local tokens = tonumber(redis.call('GET', KEYS[2]) or '0')
local call_limit, token_limit, n = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
if call_limit > 0 and calls + 1 > call_limit then return 0 end
if token_limit > 0 and tokens > 0 and tokens + n > token_limit then return 0 end
redis.call('INCR', KEYS[1])
redis.call('EXPIRE', KEYS[1], ARGV[4])
if n > 0 then
  redis.call('INCRBY', KEYS[2], n)
  redis.call('EXPIRE', KEYS[2], ARGV[4])
end
return 1
"""


@dataclass(frozen=True)
class RateLimit:
    calls_per_min: int = 0
    tokens_per_min: int = 0

    @property
    def active(self) -> bool:
        return self.calls_per_min > 0 or self.tokens_per_min > 0


@lru_cache(maxsize=1)
def _redis() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2)


@lru_cache(maxsize=1)
def _script() -> "redis.commands.core.Script":
    return _redis().register_script(_TAKE)


def rate_limit_take(
    *, kind: str, name: str, owner_id: int, limit: RateLimit, tokens: int = 0
) -> float | None:
    """Count one call of `tokens` for this owner on this tool or endpoint ("tool"/"model").

    Returns None when it may run now, else the seconds until the window turns (not counted).
    """
    if not limit.active:
        return None
    now = time.time()
    window = int(now // WINDOW_S)
    base = f"{settings.REDIS_KEY_PREFIX}:rate:{kind}:{name}:{owner_id}:{window}"
    try:
        taken = _script()(
            keys=[base + ":calls", base + ":tokens"],
            args=[limit.calls_per_min, limit.tokens_per_min, max(tokens, 0), WINDOW_S * 2],
        )
    except redis.RedisError:
        logger.warning("rate limit of %s %s unavailable (Redis)", kind, name, exc_info=True)
        return None
    if taken:
        return None
    return seconds_until_window_turns(now)


def seconds_until_window_turns(now: float) -> float:
    """The wait of a call refused at `now`: up to the next millisecond at or after the
    window turns, at least 1 ms. Rounded up, a caller that waits exactly this long is never
    early (rounded to the nearest, it came back up to half a millisecond before the turn,
    to a window still full)."""
    end = (int(now // WINDOW_S) + 1) * WINDOW_S
    return max(math.ceil((end - now) * 1000), 1) / 1000
