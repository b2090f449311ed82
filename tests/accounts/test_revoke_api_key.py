"""`manage.py revoke_api_key`: by prefix or by user, logged with who ran it."""

import io
import logging

import pytest
from django.core.management import CommandError, call_command

from accounts.models import ApiKey
from accounts.services import api_key_create

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("own_redis_prefix")]


def _run(*args: str) -> str:
    out = io.StringIO()
    call_command("revoke_api_key", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def test_revoke_by_prefix_or_whole_key(caplog):
    issued = api_key_create(username="alice", roles=[])
    keep = api_key_create(username="alice", roles=[]).api_key
    with caplog.at_level(logging.INFO, logger="accounts.services"):
        out = _run(issued.raw[:8])
    assert "revoked" in out and issued.api_key.prefix in out
    assert issued.raw not in out
    issued.api_key.refresh_from_db()
    keep.refresh_from_db()
    assert not issued.api_key.is_active and keep.is_active
    [line] = [r.getMessage() for r in caplog.records if "revoked by" in r.getMessage()]
    assert line.startswith(f"api key {issued.api_key.prefix} revoked by cli:")
    # The whole key works as well, and a second time says so.
    assert "already revoked" in _run(issued.raw)


def test_revoke_all_keys_of_a_user():
    for _ in range(2):
        api_key_create(username="bob", roles=[])
    other = api_key_create(username="carol", roles=[]).api_key
    out = _run("--user", "bob")
    assert out.count("revoked") == 2
    assert not ApiKey.objects.filter(owner__username="bob", is_active=True).exists()
    other.refresh_from_db()
    assert other.is_active


def test_revoke_refuses_what_it_cannot_pin_down():
    a = api_key_create(username="alice", roles=[]).api_key
    api_key_create(username="bob", roles=[])
    with pytest.raises(CommandError, match="give either"):
        _run()
    with pytest.raises(CommandError, match="give either"):
        _run(a.prefix, "--user", "alice")
    with pytest.raises(CommandError, match="no API key starts with"):
        _run("ap_nothing")
    with pytest.raises(CommandError, match="2 keys start with 'ap_'"):
        _run("ap_")
    with pytest.raises(CommandError, match="no user named"):
        _run("--user", "nobody")
    assert ApiKey.objects.filter(is_active=True).count() == 2
