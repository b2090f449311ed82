"""REST answers of the limits: 429 with Retry-After in the error shape, per key and per address."""

import pytest
from rest_framework.test import APIClient

from tests.factories import AgentFactory, api_key_for

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("own_redis_prefix")]


def _client(key: str, address: str = "127.0.0.1") -> APIClient:
    client = APIClient(REMOTE_ADDR=address)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    return client


def _assert_429(response) -> int:  # type: ignore[no-untyped-def]
    assert response.status_code == 429, response.content
    retry_after = int(response["Retry-After"])
    assert retry_after >= 1
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "details"}
    assert body["error"]["code"] == "rate_limited"
    assert body["error"]["details"] == {"retry_after_s": retry_after}
    # When to retry is said once, not in two phrasings.
    message = body["error"]["message"]
    assert message.count(str(retry_after)) == 1, message
    return retry_after


def test_session_creation_is_limited_per_key(settings):
    settings.SESSION_CREATE_LIMIT = 2
    settings.SESSION_CREATE_WINDOW_S = 30
    AgentFactory(slug="echo", rules=[{"answer": "hi"}])
    key, other = api_key_for("alice"), api_key_for("alice")
    for _ in range(2):
        assert (
            _client(key).post("/api/v1/sessions/", {"agent": "echo"}, format="json").status_code
            == 201
        )
    assert (
        _client(key).post("/api/v1/sessions/", {"agent": "echo"}, format="json").status_code == 429
    )
    assert (
        _assert_429(_client(key).post("/api/v1/sessions/", {"agent": "echo"}, format="json")) <= 30
    )
    # Reading is not creating, and another key of the same user has its own budget.
    assert _client(key).get("/api/v1/sessions/").status_code == 200
    assert (
        _client(other).post("/api/v1/sessions/", {"agent": "echo"}, format="json").status_code
        == 201
    )


def test_fork_counts_as_creating_a_session(settings):
    settings.SESSION_CREATE_LIMIT = 1
    AgentFactory(slug="echo", rules=[{"answer": "hi"}])
    key = api_key_for("alice")
    created = _client(key).post("/api/v1/sessions/", {"agent": "echo"}, format="json")
    assert created.status_code == 201
    fork = _client(key).post(
        f"/api/v1/sessions/{created.json()['id']}/fork/", {"checkpoint": 0}, format="json"
    )
    _assert_429(fork)


def test_a_key_failing_at_one_address_does_not_lock_out_a_good_key_there(settings):
    """One client behind a NAT keeps sending its wrong key: that key is slowed down, the
    other clients' valid keys from the same address still work."""
    settings.AUTH_FAIL_PREFIX_LIMIT = 3
    settings.AUTH_FAIL_LIMIT = 8
    settings.AUTH_FAIL_WINDOW_S = 30
    good = api_key_for("alice")
    for _ in range(3):
        response = _client("ap_wrong", "10.7.0.1").get("/api/v1/sessions/")
        assert response.status_code == 401, response.content
    for _ in range(20):  # refused before the lookup, and not counted against the address
        refused = _client("ap_wrong", "10.7.0.1").get("/api/v1/sessions/")
    assert "with this key" in refused.json()["error"]["message"]
    _assert_429(refused)
    assert _client(good, "10.7.0.1").get("/api/v1/sessions/").status_code == 200
    # The same prefix from elsewhere is not: nobody locks another's valid key out by
    # guessing against its prefix.
    assert _client("ap_wrong", "10.7.0.9").get("/api/v1/sessions/").status_code == 401


def test_many_wrong_keys_from_one_address_reach_its_ceiling(settings):
    settings.AUTH_FAIL_PREFIX_LIMIT = 3
    settings.AUTH_FAIL_LIMIT = 4
    settings.AUTH_FAIL_WINDOW_S = 30
    good = api_key_for("alice")
    for n in range(4):
        response = _client(f"ap_guess{n}", "10.7.1.1").get("/api/v1/sessions/")
        assert response.status_code == 401, response.content
    # Now the whole address waits, a good key too: it stopped a spray of guesses.
    refused = _client(good, "10.7.1.1").get("/api/v1/sessions/")
    _assert_429(refused)
    assert "from your address" in refused.json()["error"]["message"]
    # Other addresses are untouched.
    assert _client(good, "10.7.1.2").get("/api/v1/sessions/").status_code == 200


def test_behind_a_trusted_proxy_the_forwarded_address_is_counted(settings):
    settings.AUTH_FAIL_LIMIT = 2
    settings.TRUSTED_PROXY_COUNT = 1
    good = api_key_for("alice")
    for _ in range(2):
        _client("ap_wrong", "10.0.0.1").get(
            "/api/v1/sessions/", HTTP_X_FORWARDED_FOR="1.1.1.1, 203.0.113.5"
        )
    blocked = _client(good, "10.0.0.1").get("/api/v1/sessions/", HTTP_X_FORWARDED_FOR="203.0.113.5")
    _assert_429(blocked)
    # The proxy itself (other clients behind it) is not blocked.
    fine = _client(good, "10.0.0.1").get("/api/v1/sessions/", HTTP_X_FORWARDED_FOR="203.0.113.6")
    assert fine.status_code == 200, fine.content


def test_every_rest_request_counts_against_the_keys_rate(settings):
    settings.API_RATE_LIMIT = 3
    settings.API_RATE_WINDOW_S = 40
    key, other = api_key_for("carol"), api_key_for("carol")
    for _ in range(3):
        assert _client(key).get("/api/v1/sessions/").status_code == 200
    assert _assert_429(_client(key).get("/api/v1/sessions/")) <= 40
    # Creating a session counts too, and is refused with the same shape.
    _assert_429(_client(key).post("/api/v1/sessions/", {"agent": "echo"}, format="json"))
    assert _client(other).get("/api/v1/sessions/").status_code == 200
