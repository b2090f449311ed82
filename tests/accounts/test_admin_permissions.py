"""Revoking keys in the admin takes `revoke_apikey`; no one moves a key to another owner."""

import pytest
from django.test import Client
from django.urls import reverse

from accounts.models import ApiKey
from accounts.services import api_key_create
from tests.factories import StaffUserFactory, permissions

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("own_redis_prefix")]
CHANGELIST = reverse("admin:accounts_apikey_changelist")


def _client(user) -> Client:  # type: ignore[no-untyped-def]
    client = Client()
    client.force_login(user)
    return client


def _revoke(client: Client, key: ApiKey) -> None:
    client.post(CHANGELIST, {"action": "revoke_keys", "_selected_action": [key.pk], "index": 0})


def test_view_and_change_do_not_revoke_the_revoke_permission_does() -> None:
    owner = StaffUserFactory(
        username="tenant", perms=["accounts.view_apikey", "accounts.change_apikey"]
    )
    key = api_key_create(username="tenant", roles=[]).api_key
    client = _client(owner)
    assert "revoke_keys" not in client.get(CHANGELIST).content.decode()
    _revoke(client, key)
    # Nor through the change form: unticking "is active" is a revocation.
    client.post(reverse("admin:accounts_apikey_change", args=[key.pk]), {"name": "x", "roles": ""})
    key.refresh_from_db()
    assert key.is_active and key.name == "x"

    owner.user_permissions.add(*permissions("accounts.revoke_apikey"))
    assert "revoke_keys" in client.get(CHANGELIST).content.decode()
    _revoke(client, key)
    key.refresh_from_db()
    assert not key.is_active


def test_a_key_never_moves_to_another_owner() -> None:
    StaffUserFactory(username="victim")
    owner = StaffUserFactory(
        username="tenant",
        perms=["accounts.view_apikey", "accounts.change_apikey", "accounts.revoke_apikey"],
    )
    key = api_key_create(username="tenant", roles=[]).api_key
    victim_id = type(owner).objects.get(username="victim").pk
    response = _client(owner).post(
        reverse("admin:accounts_apikey_change", args=[key.pk]),
        {"owner": victim_id, "name": "mine now", "roles": "", "is_active": "on"},
    )
    assert response.status_code == 302
    key.refresh_from_db()
    assert key.owner_id == owner.pk and key.name == "mine now"
