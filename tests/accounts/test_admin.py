"""Revoking keys in the admin goes through the revocation service."""

import logging

import pytest
from django.contrib.auth import get_user_model
from django.urls import reverse

from accounts import limits
from accounts.models import ApiKey
from accounts.services import api_key_create

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("own_redis_prefix")]


@pytest.fixture
def operator(client):  # type: ignore[no-untyped-def]
    user = get_user_model().objects.create_superuser("operator", "op@example.com", "pw-not-used")
    client.force_login(user)
    return user


def test_unticking_is_active_revokes_through_the_service(client, operator, caplog):
    key = api_key_create(username="alice", roles=["support"], name="ci").api_key
    url = reverse("admin:accounts_apikey_change", args=[key.pk])
    form = {"owner": key.owner_id, "name": "ci renamed", "roles": "support"}
    with caplog.at_level(logging.INFO, logger="accounts.services"):
        response = client.post(url, form)  # "is_active" absent: unticked
    assert response.status_code == 302, response.content
    key.refresh_from_db()
    assert key.is_active is False and key.name == "ci renamed"
    assert limits.revocation_marked(key_id=key.pk)
    assert f"api key {key.prefix} revoked by admin:operator" in [
        r.getMessage() for r in caplog.records
    ]


def test_revoke_action(client, operator, caplog):
    keys = [api_key_create(username="bob", roles=[]).api_key for _ in range(2)]
    keep = api_key_create(username="bob", roles=[]).api_key
    with caplog.at_level(logging.INFO, logger="accounts.services"):
        response = client.post(
            reverse("admin:accounts_apikey_changelist"),
            {"action": "revoke_keys", "_selected_action": [k.pk for k in keys]},
        )
    assert response.status_code == 302
    assert set(ApiKey.objects.filter(is_active=False).values_list("pk", flat=True)) == {
        k.pk for k in keys
    }
    keep.refresh_from_db()
    assert keep.is_active
    assert sum("revoked by admin:operator" in r.getMessage() for r in caplog.records) == 2


def test_an_operator_grants_a_keys_max_value_in_the_admin(client, operator):
    key = api_key_create(username="alice", roles=["support"], name="app").api_key
    url = reverse("admin:accounts_apikey_change", args=[key.pk])
    form = {"owner": key.owner_id, "name": "app", "roles": "support", "is_active": "on"}
    assert b'name="max_value"' in client.get(url).content

    assert client.post(url, {**form, "max_value": "-1"}).status_code == 200  # the form's error
    key.refresh_from_db()
    assert key.max_value is None
    assert client.post(url, {**form, "max_value": "8"}).status_code == 302
    key.refresh_from_db()
    assert (key.max_value, key.is_active) == (8.0, True)
