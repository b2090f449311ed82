"""`GET /api/v1/usage/` and a session's value at creation."""

import pytest
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from accounts.models import ApiKey
from billing.models import UsageDaily
from billing.services import credit_reserve, credits_grant
from record.models import Session
from tests.factories import AgentFactory, api_key_for

pytestmark = pytest.mark.django_db


def client_for(username: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {api_key_for(username)}")
    return client


def test_usage_shows_the_callers_credits_and_usage_only():
    alice = client_for("alice")
    client_for("bob")
    users = get_user_model().objects
    owner, other = users.get(username="alice"), users.get(username="bob")
    agent = AgentFactory()
    credits_grant(owner_id=owner.pk, points=50, actor="t", daily_cap=40, set_daily_cap=True)
    credits_grant(owner_id=other.pk, points=999, actor="t")
    credit_reserve(
        owner_id=owner.pk,
        idempotency_key="k",
        points=15,
        session_id=None,
        agent_id=agent.pk,
        tool="x",
    )
    UsageDaily.objects.create(
        owner=owner, agent=agent, day="2025-01-01", input_tokens=10, output_tokens=3, cost="0.5"
    )
    UsageDaily.objects.create(
        owner=owner, agent=agent, day="2025-01-02", input_tokens=5, output_tokens=2, cost="0.25"
    )
    UsageDaily.objects.create(owner=other, agent=agent, day="2025-01-02", input_tokens=1000)

    response = alice.get("/api/v1/usage/")
    assert response.status_code == 200
    assert response.json() == {
        "credits": {"balance": 35, "reserved": 15, "daily_cap": 40, "spent_today": 15},
        "tokens": {"input": 15, "output": 5},
        "cost": "0.750000",
    }


def test_usage_without_an_account_is_all_zero():
    response = client_for("carol").get("/api/v1/usage/")
    assert response.json() == {
        "credits": {"balance": 0, "reserved": 0, "daily_cap": None, "spent_today": 0},
        "tokens": {"input": 0, "output": 0},
        "cost": "0.000000",
    }


def test_usage_needs_a_key():
    response = APIClient().get("/api/v1/usage/")
    assert response.status_code == 401
    assert set(response.json()["error"]) == {"code", "message", "details"}


def test_a_session_takes_its_value_from_the_request_or_the_agent():
    AgentFactory(slug="valued", value=3.0)
    client = client_for("dave")
    # Above the agent's own value only with a grant (README "Keys and roles").
    ApiKey.objects.filter(owner__username="dave").update(max_value=8)
    given = client.post("/api/v1/sessions/", {"agent": "valued", "value": 7.5}, format="json")
    default = client.post("/api/v1/sessions/", {"agent": "valued"}, format="json")
    assert (given.status_code, default.status_code) == (201, 201)
    assert given.json()["value"] == 7.5
    assert Session.objects.get(pk=default.json()["id"]).value == 3.0


def test_a_negative_value_is_400():
    AgentFactory(slug="valued")
    response = client_for("erin").post(
        "/api/v1/sessions/", {"agent": "valued", "value": -1}, format="json"
    )
    assert response.status_code == 400
    assert response.json()["error"]["details"]["value"]
    assert not Session.objects.exists()
