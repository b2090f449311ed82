"""The playground page: served without login, shows no data without a key, keeps keys out of URLs."""

import pytest
from django.urls import reverse

from tests.factories import AgentFactory, api_key_for

pytestmark = pytest.mark.django_db


def test_playground_lists_no_agents_to_a_visitor_without_a_key(client):
    AgentFactory(slug="secret-agent-x", name="Helpful bot")
    response = client.get(reverse("playground"))
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/html")
    page = response.content.decode()
    assert "secret-agent-x" not in page and "Helpful bot" not in page
    assert "paste an API key to see the agents" in page
    # The list the page asks for needs a key, like every other call it makes.
    anonymous = client.get("/api/v1/agents/")
    assert anonymous.status_code == 401 and anonymous.json()["error"]["code"]


def test_the_agent_list_shows_enabled_agents_to_a_key(client):
    AgentFactory(slug="helper", name="Helpful <b>bot</b>")
    AgentFactory(slug="retired", enabled=False)
    key = api_key_for("visitor")
    response = client.get("/api/v1/agents/", HTTP_AUTHORIZATION=f"Bearer {key}")
    assert response.status_code == 200
    # Names are data; the page puts them in with textContent.
    assert response.json() == [{"slug": "helper", "name": "Helpful <b>bot</b>", "version": None}]


def test_playground_is_self_contained_and_keeps_the_key_out_of_urls(client):
    page = client.get(reverse("playground")).content.decode()
    # No CDN, no external scripts or styles: everything is inline.
    assert "<script src" not in page and 'rel="stylesheet"' not in page and "https://" not in page
    # Untrusted text is only ever put in with textContent.
    assert "innerHTML" not in page and "insertAdjacentHTML" not in page
    # The contracts it talks to: REST with the key in a header, the websocket with
    # the key in a subprotocol; never `?token=` or `?key=` in a URL it makes.
    assert "/api/v1" in page and "/ws/sessions/" in page and "after=" in page
    assert '"Authorization": "Bearer "' in page and '"bearer." + apiKey()' in page
    assert "token=" not in page and 'searchParams.get("key")' not in page


def test_playground_without_agents_says_how_to_load_some(client):
    page = client.get(reverse("playground")).content.decode()
    assert "No enabled agents" in page and "apply_config" in page


def test_playground_refuses_writes(client):
    assert client.post(reverse("playground")).status_code == 405


def test_a_runs_answer_is_shown_once_from_its_message_not_again_from_turn_finished(client):
    page = client.get(reverse("playground")).content.decode()
    # The run's answer is an assistant message.completed, shown by onMessageCompleted;
    # turn.finished's handler must not add a second bubble with its `result`.
    handler = page.rsplit('case "turn.finished":', 1)[1].split("break;", 1)[0]
    assert "onTurnFinished(d)" in handler
    assert "addToTranscript" not in handler and "d.result" not in handler
    assert 'case "message.completed": onMessageCompleted(d)' in page
