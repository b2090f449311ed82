"""API keys: issued once, stored as a hash, checked on every request."""

import hashlib
import io

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from rest_framework.test import APIClient

from accounts.models import ApiKey, hash_api_key
from accounts.services import api_key_create, api_key_lookup
from tests.factories import api_key_for

pytestmark = pytest.mark.django_db

URL = "/api/v1/sessions/"


def _client(header: str | None = None) -> APIClient:
    client = APIClient()
    if header is not None:
        client.credentials(HTTP_AUTHORIZATION=header)
    return client


def _assert_error(response, status: int, code: str) -> None:  # type: ignore[no-untyped-def]
    assert response.status_code == status, response.content
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"code", "message", "details"}
    assert body["error"]["code"] == code
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    assert isinstance(body["error"]["details"], dict)


def test_create_api_key_prints_a_key_that_authenticates_and_stores_only_its_hash():
    out, err = io.StringIO(), io.StringIO()
    call_command("create_api_key", "--user", "x", "--roles", "b,a", stdout=out, stderr=err)

    raw = out.getvalue().strip()
    assert raw.startswith("ap_") and len(raw) > 40
    assert raw not in err.getvalue()
    key = ApiKey.objects.get()
    assert key.owner.username == "x"
    assert key.roles == ["b", "a"]
    assert key.key_hash == hashlib.sha256(raw.encode()).hexdigest()
    # The raw key is stored nowhere, only its hash and a short recognisable prefix.
    stored = [str(v) for v in ApiKey.objects.values().get().values()]
    assert raw not in stored
    assert key.prefix == raw[:10]

    response = _client(f"Bearer {raw}").get(URL)
    assert response.status_code == 200, response.content
    assert response.json() == []


def test_create_api_key_reuses_the_user_and_each_key_is_new():
    first = api_key_create(username="x", roles=["support"]).raw
    second = api_key_create(username="x", roles=[" support ", "", "analyst", "support"]).raw
    assert first != second
    assert get_user_model().objects.filter(username="x").count() == 1
    # Deduplicated, trimmed, and in the given order: the first is a new session's default role.
    assert api_key_lookup(raw=second).roles == ["support", "analyst"]


def test_lookup_finds_only_active_keys_of_active_users():
    raw = api_key_for("alice")
    assert api_key_lookup(raw=raw).owner.username == "alice"
    assert api_key_lookup(raw="") is None
    assert api_key_lookup(raw=raw + "x") is None
    ApiKey.objects.update(is_active=False)
    assert api_key_lookup(raw=raw) is None


def test_missing_key_is_401():
    response = _client().get(URL)
    _assert_error(response, 401, "not_authenticated")
    assert response["WWW-Authenticate"] == "Bearer"


@pytest.mark.parametrize(
    "header",
    ["Bearer ap_not-a-real-key", "Bearer", "Token something", "Bearer a b"],
)
def test_wrong_keys_and_schemes_are_401(header):
    api_key_for("alice")
    _assert_error(_client(header).get(URL), 401, "authentication_failed")


def test_an_inactive_key_is_401():
    raw = api_key_for("alice")
    assert _client(f"Bearer {raw}").get(URL).status_code == 200
    ApiKey.objects.update(is_active=False)
    _assert_error(_client(f"Bearer {raw}").get(URL), 401, "authentication_failed")


def test_a_key_of_a_deactivated_user_is_401():
    raw = api_key_for("alice")
    get_user_model().objects.filter(username="alice").update(is_active=False)
    _assert_error(_client(f"Bearer {raw}").get(URL), 401, "authentication_failed")


def test_every_endpoint_needs_a_key():
    paths = [
        ("get", URL),
        ("post", URL),
        ("get", f"{URL}00000000-0000-0000-0000-000000000001/"),
        ("get", f"{URL}00000000-0000-0000-0000-000000000001/messages/"),
        ("post", f"{URL}00000000-0000-0000-0000-000000000001/messages/"),
        ("get", f"{URL}00000000-0000-0000-0000-000000000001/events/"),
        ("post", f"{URL}00000000-0000-0000-0000-000000000001/cancel/"),
    ]
    for method, path in paths:
        _assert_error(getattr(_client(), method)(path, {}, format="json"), 401, "not_authenticated")


def test_hash_is_stable_sha256():
    assert hash_api_key("abc") == hashlib.sha256(b"abc").hexdigest()
