"""API key services: authentication with the slow-down, revocation, last use."""

import logging
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from accounts import limits
from accounts.models import PREFIX_CHARS, ApiKey
from accounts.services import (
    api_key_authenticate,
    api_key_create,
    api_key_last_used_write,
    api_key_revoke,
    api_keys_revoke_for_user,
)

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("own_redis_prefix")]


def test_a_slowed_down_address_is_refused_before_its_key_is_looked_up(settings):
    settings.AUTH_FAIL_LIMIT = 2
    raw = api_key_create(username="alice", roles=["support"]).raw
    assert api_key_authenticate(raw="ap_wrong1", address="10.9.0.1").retry_after_s is None
    assert api_key_authenticate(raw="ap_wrong2", address="10.9.0.1").api_key is None
    refused = api_key_authenticate(raw=raw, address="10.9.0.1")
    assert refused.api_key is None and refused.retry_after_s is not None
    assert refused.slowed == "address"
    # Another address with the same key is fine, and succeeding does not count.
    for _ in range(3):
        assert api_key_authenticate(raw=raw, address="10.9.0.2").api_key is not None
    # No key at all is not a guess: it is not counted.
    for _ in range(3):
        assert api_key_authenticate(raw="", address="10.9.0.3").retry_after_s is None
    assert api_key_authenticate(raw=raw, address="10.9.0.3").api_key is not None


def test_wrong_keys_slow_their_prefix_down_and_not_the_valid_key_beside_them(settings):
    settings.AUTH_FAIL_PREFIX_LIMIT = 2
    settings.AUTH_FAIL_LIMIT = 5
    raw = api_key_create(username="alice", roles=["support"]).raw
    # Someone guesses alice's key's tail, keeping its prefix.
    guess = raw[:PREFIX_CHARS] + "x" * 30
    for _ in range(2):
        assert api_key_authenticate(raw=guess, address="10.9.1.1").retry_after_s is None
    slowed = api_key_authenticate(raw=guess, address="10.9.1.1")
    assert (slowed.api_key, slowed.slowed) == (None, "key") and slowed.retry_after_s
    assert slowed.slow_down_message == "too many failed authentication attempts with this key"
    # Another user's key from the guesser's own address works: 2 failures < 5.
    other = api_key_create(username="bob", roles=["support"]).raw
    assert api_key_authenticate(raw=other, address="10.9.1.1").api_key is not None
    # Alice, from her own address, is not locked out by the guesser.
    assert api_key_authenticate(raw=raw, address="10.9.1.3").api_key is not None


def test_revoke_deactivates_marks_and_logs_who_without_the_key(caplog):
    issued = api_key_create(username="alice", roles=["support"])
    key = issued.api_key
    with caplog.at_level(logging.INFO, logger="accounts.services"):
        assert api_key_revoke(api_key=key, actor="cli:ops") is True
        assert api_key_revoke(api_key=key, actor="cli:ops") is False  # again: no change
    key.refresh_from_db()
    assert key.is_active is False
    assert limits.revocation_marked(key_id=key.pk)
    assert api_key_authenticate(raw=issued.raw, address="10.9.0.4").api_key is None
    lines = [r.getMessage() for r in caplog.records]
    assert f"api key {key.prefix} revoked by cli:ops" in lines
    assert all(issued.raw not in line for line in lines)


def test_revoke_for_user_revokes_every_key_of_that_user_only():
    first = api_key_create(username="bob", roles=[]).api_key
    second = api_key_create(username="bob", roles=[]).api_key
    other = api_key_create(username="carol", roles=[]).api_key
    api_key_revoke(api_key=second, actor="test")
    outcomes = api_keys_revoke_for_user(username="bob", actor="test")
    assert [(k.pk, was_active) for k, was_active in outcomes] == [
        (first.pk, True),
        (second.pk, False),
    ]
    assert not ApiKey.objects.filter(owner__username="bob", is_active=True).exists()
    other.refresh_from_db()
    assert other.is_active


def test_last_used_write_happens_at_most_once_a_minute():
    key = api_key_create(username="alice", roles=[]).api_key
    now = timezone.now()
    assert api_key_last_used_write(key_id=key.pk, now=now) == 1
    assert api_key_last_used_write(key_id=key.pk, now=now + timedelta(seconds=30)) == 0
    assert api_key_last_used_write(key_id=key.pk, now=now + timedelta(seconds=61)) == 1
    key.refresh_from_db()
    assert key.last_used_at == now + timedelta(seconds=61)


@pytest.mark.django_db(transaction=True)
def test_authenticating_stamps_last_used_off_the_request_thread():
    issued = api_key_create(username="alice", roles=[])
    assert issued.api_key.last_used_at is None
    assert api_key_authenticate(raw=issued.raw, address="10.9.0.5").api_key is not None
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        issued.api_key.refresh_from_db()
        if issued.api_key.last_used_at is not None:
            break
        time.sleep(0.05)
    assert issued.api_key.last_used_at is not None
    stamped = issued.api_key.last_used_at
    # Within the minute nothing more is written.
    api_key_authenticate(raw=issued.raw, address="10.9.0.5")
    time.sleep(0.3)
    issued.api_key.refresh_from_db()
    assert issued.api_key.last_used_at == stamped
