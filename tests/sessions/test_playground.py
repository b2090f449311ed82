"""The playground page: served without login, lists enabled agents, escapes what it shows."""

import pytest
from django.urls import reverse

from tests.factories import AgentFactory

pytestmark = pytest.mark.django_db


def test_playground_lists_enabled_agents_without_login(client):
    AgentFactory(slug="helper", name="Helpful <b>bot</b>")
    AgentFactory(slug="retired", enabled=False)
    response = client.get(reverse("playground"))
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/html")
    page = response.content.decode()
    assert '<option value="helper">' in page
    assert "retired" not in page
    # Agent names are data: escaped, never markup.
    assert "Helpful &lt;b&gt;bot&lt;/b&gt;" in page and "<b>bot</b>" not in page


def test_playground_is_self_contained(client):
    page = client.get(reverse("playground")).content.decode()
    # No CDN, no external scripts or styles: everything is inline.
    assert "<script src" not in page and 'rel="stylesheet"' not in page and "https://" not in page
    # Untrusted text is only ever put in with textContent.
    assert "innerHTML" not in page and "insertAdjacentHTML" not in page
    # The contracts it talks to.
    assert "/api/v1" in page and "/ws/sessions/" in page and "after=" in page and "token=" in page


def test_playground_without_agents_says_how_to_load_some(client):
    page = client.get(reverse("playground")).content.decode()
    assert "no enabled agents" in page and "apply_config" in page


def test_playground_refuses_writes(client):
    assert client.post(reverse("playground")).status_code == 405
