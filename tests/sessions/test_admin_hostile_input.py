"""Odd ids and NUL query parameters in the admin: 404 and 400, never a 500 (issue 15, item 5)."""

import uuid

import pytest
from django.contrib.auth import get_user_model
from django.urls import reverse

from record.models import Session, Transition
from tests.factories import SessionFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def operator(client):  # type: ignore[no-untyped-def]
    user = get_user_model().objects.create_superuser("op", "op@example.com", "pw-not-used")
    client.force_login(user)
    return user


@pytest.mark.parametrize("object_id", ["not-a-uuid", "123", "%00", "x" * 300])
def test_cancel_with_a_malformed_id_is_404(client, operator, object_id):
    session = SessionFactory()
    response = client.post(f"/admin/agent_sessions/session/{object_id}/cancel/")
    assert response.status_code == 404, response.content
    session.refresh_from_db()
    assert not session.cancel_requested
    assert not Transition.objects.exists()


def test_cancel_of_a_missing_session_is_404(client, operator):
    url = reverse("admin:agent_sessions_session_cancel", args=[uuid.uuid4()])
    assert client.post(url).status_code == 404


@pytest.mark.parametrize(
    "query",
    [
        "state=%00",
        "role=x%00y",
        "q=%00",
        "agent__id__exact=%00",
        "model_calls__endpoint_name=%00",
        "o=%00",
        "%00=1",
    ],
)
def test_a_nul_in_a_list_filter_or_search_is_400(client, operator, query):
    SessionFactory()
    for name in ("session", "message", "toolcall", "transition", "event", "modelcall"):
        url = reverse(f"admin:agent_sessions_{name}_changelist") + "?" + query
        response = client.get(url)
        assert response.status_code == 400, (name, query, response.content[:300])
        assert response.json()["error"]["code"] == "invalid_input"
    assert Session.objects.count() == 1


def test_filters_without_nul_still_work(client, operator):
    SessionFactory(role="support")
    url = reverse("admin:agent_sessions_session_changelist")
    page = client.get(url, {"role": "support", "q": "x"})
    assert page.status_code == 200
    page = client.get(url, {"role": "support"})
    assert page.context["cl"].result_count == 1
