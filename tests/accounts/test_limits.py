"""The shared limits, against the real Redis."""

import asyncio
import time

import pytest

from accounts import limits

pytestmark = pytest.mark.usefixtures("own_redis_prefix")


def test_failed_authentication_slows_an_address_down_after_the_limit(settings):
    settings.AUTH_FAIL_LIMIT = 3
    settings.AUTH_FAIL_PREFIX_LIMIT = 0
    settings.AUTH_FAIL_WINDOW_S = 30
    for n in range(2):
        limits.auth_failure_record(address="10.0.0.1", prefix=f"ap_p{n}")
    assert limits.auth_retry_after(address="10.0.0.1", prefix="ap_any") is None
    limits.auth_failure_record(address="10.0.0.1", prefix="ap_p2")
    slow = limits.auth_retry_after(address="10.0.0.1", prefix="ap_any")
    assert slow is not None and slow.scope == "address" and 1 <= slow.retry_after_s <= 30
    # Only that address.
    assert limits.auth_retry_after(address="10.0.0.2", prefix="ap_any") is None


def test_failed_authentication_slows_a_key_prefix_down_from_that_address_only(settings):
    settings.AUTH_FAIL_LIMIT = 10
    settings.AUTH_FAIL_PREFIX_LIMIT = 2
    settings.AUTH_FAIL_WINDOW_S = 30
    limits.auth_failure_record(address="10.0.1.1", prefix="ap_target")
    assert limits.auth_retry_after(address="10.0.1.1", prefix="ap_target") is None
    limits.auth_failure_record(address="10.0.1.1", prefix="ap_target")
    slow = limits.auth_retry_after(address="10.0.1.1", prefix="ap_target")
    assert slow is not None and slow.scope == "key" and 1 <= slow.retry_after_s <= 30
    # The same prefix from anywhere else is not slowed down: guessing against someone's
    # prefix never locks their valid key out.
    assert limits.auth_retry_after(address="10.0.1.2", prefix="ap_target") is None
    # Another prefix from the same address is not slowed down: its counts are far below 10.
    assert limits.auth_retry_after(address="10.0.1.1", prefix="ap_other") is None


def test_the_address_is_reported_when_both_are_over(settings):
    settings.AUTH_FAIL_LIMIT = 1
    settings.AUTH_FAIL_PREFIX_LIMIT = 1
    limits.auth_failure_record(address="10.0.2.1", prefix="ap_both")
    assert limits.auth_retry_after(address="10.0.2.1", prefix="ap_both").scope == "address"  # type: ignore[union-attr]


def test_failed_authentication_window_ends(settings):
    settings.AUTH_FAIL_LIMIT = 1
    settings.AUTH_FAIL_PREFIX_LIMIT = 1
    settings.AUTH_FAIL_WINDOW_S = 1
    limits.auth_failure_record(address="10.0.0.3", prefix="ap_w")
    assert limits.auth_retry_after(address="10.0.0.3", prefix="ap_x").retry_after_s == 1  # type: ignore[union-attr]
    assert limits.auth_retry_after(address="10.0.0.3", prefix="ap_w").retry_after_s == 1  # type: ignore[union-attr]
    time.sleep(2.1)
    assert limits.auth_retry_after(address="10.0.0.3", prefix="ap_w") is None


def test_zero_switches_a_limit_off(settings):
    settings.AUTH_FAIL_LIMIT = 0
    settings.AUTH_FAIL_PREFIX_LIMIT = 0
    settings.SESSION_CREATE_LIMIT = 0
    settings.WS_MAX_SOCKETS_PER_KEY = 0
    for _ in range(5):
        limits.auth_failure_record(address="10.0.0.4", prefix="ap_off")
        assert limits.session_create_retry_after(key_id=1) is None
        assert limits.socket_slot_acquire(key_id=1, socket_id=str(_))
    assert limits.auth_retry_after(address="10.0.0.4", prefix="ap_off") is None


def test_session_creation_is_counted_per_key_in_a_window(settings):
    settings.SESSION_CREATE_LIMIT = 2
    settings.SESSION_CREATE_WINDOW_S = 40
    assert limits.session_create_retry_after(key_id=7) is None
    assert limits.session_create_retry_after(key_id=7) is None
    retry = limits.session_create_retry_after(key_id=7)
    assert retry is not None and 1 <= retry <= 40
    assert limits.session_create_retry_after(key_id=8) is None


def test_socket_slots_are_limited_per_key_and_a_dead_process_slots_lapse(settings):
    settings.WS_MAX_SOCKETS_PER_KEY = 2
    settings.WS_SLOT_TTL_S = 1
    assert limits.socket_slot_acquire(key_id=1, socket_id="a")
    assert limits.socket_slot_acquire(key_id=1, socket_id="b")
    assert not limits.socket_slot_acquire(key_id=1, socket_id="c")
    assert limits.socket_slot_acquire(key_id=2, socket_id="c")  # another key
    limits.socket_slot_release(key_id=1, socket_id="a")
    assert limits.socket_slot_acquire(key_id=1, socket_id="c")
    assert limits.socket_slots_held(key_id=1) == 2
    # Nobody refreshes "b" and "c" (their process died): their slots lapse.
    time.sleep(1.2)
    assert limits.socket_slots_held(key_id=1) == 0
    assert limits.socket_slot_acquire(key_id=1, socket_id="d")
    assert limits.socket_slot_acquire(key_id=1, socket_id="e")


def test_held_slots_are_kept_alive_by_the_process_heartbeat(settings):
    settings.WS_MAX_SOCKETS_PER_KEY = 1
    settings.WS_SLOT_TTL_S = 1

    async def scenario() -> tuple[bool, int, bool]:
        slots = limits.SocketSlots()
        assert await slots.acquire(key_id=3, socket_id="live")
        await asyncio.sleep(2.5)  # well past the TTL: only the heartbeat keeps it
        refused = not await slots.acquire(key_id=3, socket_id="other")
        held = limits.socket_slots_held(key_id=3)
        await slots.release(key_id=3, socket_id="live")
        return refused, held, await slots.acquire(key_id=3, socket_id="other")

    refused, held, after_release = asyncio.run(scenario())
    assert refused and held == 1 and after_release


def test_client_address_trusts_only_the_configured_proxies(settings):
    settings.TRUSTED_PROXY_COUNT = 0
    assert limits.client_address(peer="10.1.1.1", forwarded_for="6.6.6.6") == "10.1.1.1"
    settings.TRUSTED_PROXY_COUNT = 1
    # The client may put anything on the left; the proxy appended what it saw.
    assert limits.client_address(peer="10.1.1.1", forwarded_for="6.6.6.6, 1.2.3.4") == "1.2.3.4"
    settings.TRUSTED_PROXY_COUNT = 2
    assert (
        limits.client_address(peer="10.1.1.1", forwarded_for="6.6.6.6, 1.2.3.4, 10.0.0.9")
        == "1.2.3.4"
    )
    assert limits.client_address(peer="10.1.1.1", forwarded_for=None) == "10.1.1.1"
    assert limits.client_address(peer=None, forwarded_for="") == "unknown"


def test_revocation_mark_and_last_used_claim():
    assert not limits.revocation_marked(key_id=5)
    limits.revocation_mark(key_id=5)
    assert limits.revocation_marked(key_id=5)
    assert not limits.revocation_marked(key_id=6)
    assert limits.last_used_claim(key_id=5)
    assert not limits.last_used_claim(key_id=5)  # at most once a minute
    assert limits.last_used_claim(key_id=6)
