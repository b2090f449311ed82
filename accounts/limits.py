"""Limits that protect the API itself, kept in Redis so every web process shares them.

- failed authentications per key prefix and, as a higher ceiling, per client address
  (fixed windows; over either limit a request gets 429 before its key is even looked up),
- sessions created per API key (a fixed window),
- open websockets per API key, per kind of socket (a sorted set of socket ids
  scored by a deadline that the socket's heartbeat pushes forward, so a crashed
  process's slots lapse): sessions' sockets and approvers' sockets are counted
  apart, each against its own setting,
- a revocation marker per key, which open sockets check on every client frame.

Redis being down must not take the API down with it: every limit then lets the
request through, and the revocation marker answers "look in the database".
"""

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

import redis
from asgiref.sync import sync_to_async
from django.conf import settings

logger = logging.getLogger(__name__)

# Revocation also closes the key's sockets at once; the marker only has to
# outlive the moment between the database commit and that close arriving.
REVOCATION_MARK_S = 3600
LAST_USED_INTERVAL_S = 60

# INCR and set the window's expiry in one step, so no crash between the two can
# leave a counter without a TTL; returns the count and the seconds left.
_WINDOW_HIT = """
local n = redis.call('INCR', KEYS[1])
local ttl = redis.call('TTL', KEYS[1])
if ttl < 0 then
  redis.call('EXPIRE', KEYS[1], ARGV[1])
  ttl = tonumber(ARGV[1])
end
return {n, ttl}
"""

# Drop lapsed slots, then take one if fewer than the limit are held.
_SLOT_ACQUIRE = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
if redis.call('ZSCORE', KEYS[1], ARGV[3]) or redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[4]) then
  redis.call('ZADD', KEYS[1], ARGV[2], ARGV[3])
  redis.call('EXPIRE', KEYS[1], ARGV[5])
  return 1
end
return 0
"""


@lru_cache(maxsize=1)
def _redis() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2)


def _key(*parts: object) -> str:
    return ":".join([settings.REDIS_KEY_PREFIX, "limits", *map(str, parts)])


def _window_hit(key: str, window_s: int) -> tuple[int, int]:
    count, ttl = _redis().eval(_WINDOW_HIT, 1, key, max(int(window_s), 1))
    return int(count), max(int(ttl), 1)


def client_address(*, peer: str | None, forwarded_for: str | None) -> str:
    """The caller's address: the peer's, or (behind trusted proxies) the one they recorded.

    Each trusted proxy appends the address it saw, so with N of them the
    client is the N-th entry from the right; anything further left is the
    client's own claim and is not trusted.
    """
    proxies = settings.TRUSTED_PROXY_COUNT
    if proxies > 0 and forwarded_for:
        hops = [hop.strip() for hop in forwarded_for.split(",") if hop.strip()]
        if hops:
            return hops[-min(proxies, len(hops))]
    return peer or "unknown"


# Failed authentication --------------------------------------------------------------
#
# Two counters in one window (AUTH_FAIL_WINDOW_S). Per address and key prefix
# (AUTH_FAIL_PREFIX_LIMIT): wrong keys presented with one prefix from one address slow
# that pair down, so one client failing behind a NAT is slowed alone, and nobody can
# lock a valid key out by guessing against its prefix from elsewhere. Per address
# (AUTH_FAIL_LIMIT), a higher ceiling: a client trying many prefixes is stopped there,
# while the valid keys of others behind the same address (a NAT, an office proxy) keep
# working until it is reached. A request refused for either is not counted again, so
# one client failing with one key adds at most the prefix limit to its address per
# window. A guess spread over many addresses is not slowed by either; with keys of 32
# random characters after their prefix it cannot succeed anyway.


@dataclass(frozen=True)
class SlowDown:
    """Why a caller must wait, and for how long."""

    retry_after_s: int
    scope: str  # "address" (AUTH_FAIL_LIMIT) or "key" (AUTH_FAIL_PREFIX_LIMIT)


def _auth_counters(address: str, prefix: str) -> list[tuple[str, str, int]]:
    """(scope, Redis key, limit) of the counters that are on, the address first."""
    # The prefix is hashed: a wrong "key" may be someone's secret for another system.
    digest = hashlib.sha256(prefix.encode()).hexdigest()[:16]
    counters = [
        ("address", _key("authfail", address), settings.AUTH_FAIL_LIMIT),
        ("key", _key("authfail-prefix", address, digest), settings.AUTH_FAIL_PREFIX_LIMIT),
    ]
    return [c for c in counters if c[2] > 0]


def auth_retry_after(*, address: str, prefix: str) -> SlowDown | None:
    """Whether this address, or this key prefix from it, failed authentication too often.

    The address is reported first when both are over: its wait covers every key.
    """
    counters = _auth_counters(address, prefix)
    if not counters:
        return None
    try:
        # Every request asks (one round trip); only a caller over a limit needs the second.
        counts = _redis().mget([key for _scope, key, _limit in counters])
        over = next(
            (
                (scope, key)
                for (scope, key, limit), count in zip(counters, counts, strict=True)
                if count is not None and int(count) >= limit
            ),
            None,
        )
        if over is None:
            return None
        ttl = _redis().ttl(over[1])
    except redis.RedisError:
        logger.warning("auth slow-down unavailable (Redis)", exc_info=True)
        return None
    return SlowDown(retry_after_s=max(int(ttl), 1), scope=over[0])


def auth_failure_record(*, address: str, prefix: str) -> None:
    """Count one wrong key against its address and its prefix from there (one round trip)."""
    counters = _auth_counters(address, prefix)
    if not counters:
        return
    window = max(int(settings.AUTH_FAIL_WINDOW_S), 1)
    try:
        pipe = _redis().pipeline(transaction=False)
        for _scope, key, _limit in counters:
            pipe.eval(_WINDOW_HIT, 1, key, window)
        pipe.execute()
    except redis.RedisError:
        logger.warning("could not count a failed authentication (Redis)", exc_info=True)


# Session creation -------------------------------------------------------------------


def session_create_retry_after(*, key_id: int) -> int | None:
    """Count one session creation by this key; seconds to wait if over the limit."""
    limit = settings.SESSION_CREATE_LIMIT
    if limit <= 0:
        return None
    try:
        count, ttl = _window_hit(_key("sessions", key_id), settings.SESSION_CREATE_WINDOW_S)
    except redis.RedisError:
        logger.warning("session creation limit unavailable (Redis)", exc_info=True)
        return None
    return ttl if count > limit else None


def api_request_retry_after(*, key_id: int) -> int | None:
    """Count one REST request by this key; seconds to wait if over API_RATE_LIMIT."""
    limit = settings.API_RATE_LIMIT
    if limit <= 0:
        return None
    try:
        count, ttl = _window_hit(_key("requests", key_id), settings.API_RATE_WINDOW_S)
    except redis.RedisError:
        logger.warning("API request limit unavailable (Redis)", exc_info=True)
        return None
    return ttl if count > limit else None


# Open websockets --------------------------------------------------------------------

# A pool is a kind of socket, counted per key against its own setting.
SESSION_SOCKETS = "sockets"
APPROVAL_SOCKETS = "approval-sockets"
# The admin's queue page on the same socket, signed in (counted per user, not per key).
ADMIN_APPROVAL_SOCKETS = "admin-approval-sockets"
_POOL_LIMITS = {
    SESSION_SOCKETS: "WS_MAX_SOCKETS_PER_KEY",
    APPROVAL_SOCKETS: "APPROVAL_WS_MAX_SOCKETS_PER_KEY",
    ADMIN_APPROVAL_SOCKETS: "APPROVAL_WS_MAX_SOCKETS_PER_KEY",
}
Slot = tuple[str, int, str]  # (pool, key id, socket id)


def socket_limit(pool: str) -> int:
    """The open sockets of this pool a key may hold (0: no limit); read at call time."""
    return int(getattr(settings, _POOL_LIMITS[pool]))


def socket_slot_acquire(*, key_id: int, socket_id: str, pool: str = SESSION_SOCKETS) -> bool:
    limit = socket_limit(pool)
    if limit <= 0:
        return True
    now = time.time()
    ttl = max(settings.WS_SLOT_TTL_S, 1)
    try:
        taken = _redis().eval(
            _SLOT_ACQUIRE, 1, _key(pool, key_id), now, now + ttl, socket_id, limit, ttl * 2
        )
    except redis.RedisError:
        logger.warning("socket limit unavailable (Redis)", exc_info=True)
        return True
    return bool(taken)


def socket_slots_refresh(*, slots: Iterable[Slot]) -> None:
    """The heartbeat of open sockets: push their slots' deadlines forward, in one round trip."""
    ttl = max(settings.WS_SLOT_TTL_S, 1)
    deadline = time.time() + ttl
    try:
        pipe = _redis().pipeline(transaction=False)
        for pool, key_id, socket_id in slots:
            pipe.zadd(_key(pool, key_id), {socket_id: deadline}, xx=True)
            pipe.expire(_key(pool, key_id), ttl * 2)
        pipe.execute()
    except redis.RedisError:
        logger.warning("socket slot refresh failed; retrying next period", exc_info=True)


def socket_slot_release(*, key_id: int, socket_id: str, pool: str = SESSION_SOCKETS) -> None:
    try:
        _redis().zrem(_key(pool, key_id), socket_id)
    except redis.RedisError:
        logger.debug("socket slot release failed; it lapses by itself", exc_info=True)


def socket_slots_held(*, key_id: int, pool: str = SESSION_SOCKETS) -> int:
    try:
        return int(_redis().zcount(_key(pool, key_id), time.time(), "+inf"))
    except redis.RedisError:
        return 0


class SocketSlots:
    """The slots this process's sockets hold, kept alive by one task for all of them.

    One pipelined refresh per period for the whole process, rather than a timer
    and a round trip per socket: thousands of idle sockets stay nearly free.
    """

    def __init__(self) -> None:
        self._held: set[Slot] = set()
        self._task: asyncio.Task[None] | None = None

    async def acquire(self, *, key_id: int, socket_id: str, pool: str = SESSION_SOCKETS) -> bool:
        if socket_limit(pool) <= 0:
            return True
        taken = await sync_to_async(socket_slot_acquire, thread_sensitive=False)(
            key_id=key_id, socket_id=socket_id, pool=pool
        )
        if taken:
            self._held.add((pool, key_id, socket_id))
            if self._task is None or self._task.done():
                self._task = asyncio.ensure_future(self._refresh_while_held())
        return taken

    async def release(self, *, key_id: int, socket_id: str, pool: str = SESSION_SOCKETS) -> None:
        if (pool, key_id, socket_id) not in self._held:
            return
        self._held.discard((pool, key_id, socket_id))
        await sync_to_async(socket_slot_release, thread_sensitive=False)(
            key_id=key_id, socket_id=socket_id, pool=pool
        )

    async def _refresh_while_held(self) -> None:
        while self._held:
            await asyncio.sleep(max(settings.WS_SLOT_TTL_S, 1) / 3)
            with contextlib.suppress(Exception):
                await sync_to_async(socket_slots_refresh, thread_sensitive=False)(
                    slots=list(self._held)
                )


socket_slots = SocketSlots()


# Revocation and last use ------------------------------------------------------------


def revocation_mark(*, key_id: int) -> None:
    try:
        _redis().set(_key("revoked", key_id), "1", ex=REVOCATION_MARK_S)
    except redis.RedisError:
        logger.warning("could not mark key %s revoked in Redis", key_id, exc_info=True)


def revocation_marked(*, key_id: int) -> bool:
    """True when the key may have been revoked lately (or Redis cannot say): check the database."""
    try:
        return bool(_redis().exists(_key("revoked", key_id)))
    except redis.RedisError:
        return True


def last_used_claim(*, key_id: int) -> bool:
    """True for at most one caller per key per LAST_USED_INTERVAL_S, across all processes."""
    try:
        return bool(_redis().set(_key("lastused", key_id), "1", nx=True, ex=LAST_USED_INTERVAL_S))
    except redis.RedisError:
        return False
