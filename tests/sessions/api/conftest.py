"""An authenticated API client and a session owned by its key's user."""

from typing import Any

import pytest
from rest_framework.test import APIClient

from tests.factories import api_key_for


class Api:
    """An APIClient with a key that also checks every answer is a JSON object or list, never a 500."""

    def __init__(self, key: str | None) -> None:
        self.client = APIClient()
        if key is not None:
            self.client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")

    def _check(self, response):  # type: ignore[no-untyped-def]
        assert response.status_code < 500, response.content
        return response

    def get(self, path: str, params: dict[str, Any] | None = None):  # type: ignore[no-untyped-def]
        return self._check(self.client.get(path, params or {}))

    def post(self, path: str, data: Any = None, **kwargs: Any):  # type: ignore[no-untyped-def]
        kwargs.setdefault("format", "json")
        return self._check(self.client.post(path, data, **kwargs))

    def post_raw(self, path: str, body: str | bytes, content_type: str = "application/json"):  # type: ignore[no-untyped-def]
        return self._check(self.client.generic("POST", path, body, content_type=content_type))


def assert_error(response, status: int, code: str | None = None) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    assert response.status_code == status, response.content
    assert response["Content-Type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == {"code", "message", "details"}, error
    assert isinstance(error["code"], str) and error["code"]
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["details"], dict)
    if code is not None:
        assert error["code"] == code, error
    return error


@pytest.fixture
def api_agent(make_agent):  # type: ignore[no-untyped-def]
    return make_agent(slug="helper")


@pytest.fixture
def api(db, api_agent) -> Api:  # type: ignore[no-untyped-def]
    return Api(api_key_for("alice", roles=("support", "analyst")))


@pytest.fixture
def other_api(db, api_agent) -> Api:  # type: ignore[no-untyped-def]
    return Api(api_key_for("mallory"))


@pytest.fixture
def session_id(api: Api) -> str:
    response = api.post("/api/v1/sessions/", {"agent": "helper"})
    assert response.status_code == 201, response.content
    return response.json()["id"]
