"""The workflows REST contract: list what a key may start, start a run, follow it as a session."""

import uuid
from typing import Any

import pytest
import yaml

from accounts.models import ApiKey
from record.models import Message, Session
from tests.factories import AgentFactory, ModelEndpointFactory, ToolFactory, api_key_for
from tests.sessions.api.conftest import Api, assert_error
from workflows.models import Workflow
from workflows.selectors import definition_check
from workflows.services import workflow_apply

pytestmark = pytest.mark.django_db

FLOW = """
slug: lookup-flow
name: Look an order up
role: support
input:
  type: object
  properties: {number: {type: string, pattern: "^SO-[0-9]+$"}, notes: {type: array, items: {type: string}}}
  required: [number]
start: look
result: order
nodes:
  look: {kind: tool, tool: clock, args: {}, output: order, next: end}
"""


@pytest.fixture
def workflow() -> Workflow:
    ModelEndpointFactory()
    ToolFactory(name="clock", roles=["support"])
    raw = yaml.safe_load(FLOW)
    workflow_apply(definition=definition_check(raw, where="t"), where="t", default_model="rules")
    return Workflow.objects.get(slug="lookup-flow")


@pytest.fixture
def support() -> Api:
    return Api(api_key_for("alice", roles=("support",)))


RUNS = "/api/v1/workflows/lookup-flow/runs/"


def test_the_list_names_the_workflows_the_key_may_start(workflow: Workflow, support: Api) -> None:
    body = support.get("/api/v1/workflows/").json()
    assert body == [
        {
            "slug": "lookup-flow",
            "name": "Look an order up",
            "description": "",
            "role": "support",
            "version": 1,
            "input": yaml.safe_load(FLOW)["input"],
        }
    ]
    analyst = Api(api_key_for("bob", roles=("analyst",)))
    assert analyst.get("/api/v1/workflows/").json() == []


def test_a_run_starts_as_a_session_of_the_workflow(workflow: Workflow, support: Api) -> None:
    response = support.post(RUNS, {"input": {"number": "SO-1"}, "metadata": {"ticket": "T-9"}})

    assert response.status_code == 201, response.content
    body = response.json()
    assert body["workflow"] == "lookup-flow" and body["version"] == 1
    assert body["state"] == "processing" and body["metadata"] == {"ticket": "T-9"}
    session = support.get(f"/api/v1/sessions/{body['id']}/").json()
    assert session["workflow"] == {
        "slug": "lookup-flow",
        "version": 1,
        "active": ["look"],
        "result": None,
        "error": None,
    }
    assert session["role"] == "support"
    # Its model calls are charged to the key that started it (its spend and budget).
    key = ApiKey.objects.get(owner__username="alice")
    assert Session.objects.get(pk=body["id"]).api_key_id == key.pk


@pytest.mark.parametrize(
    ("value", "path"),
    [
        ({}, "$.input"),
        ({"number": "SO-x"}, "$.input.number"),
        ({"number": "SO-1", "notes": ["a", 3]}, "$.input.notes[1]"),
    ],
)
def test_bad_input_is_400_naming_the_path_and_starts_nothing(
    workflow: Workflow, support: Api, value: dict[str, Any], path: str
) -> None:
    error = assert_error(support.post(RUNS, {"input": value}), 400, "invalid_input")
    assert error["details"]["path"] == path
    assert error["message"].startswith(path)
    assert not Session.objects.exists()


def test_input_that_is_not_an_object_is_400(workflow: Workflow, support: Api) -> None:
    error = assert_error(support.post(RUNS, {"input": [1]}), 400, "invalid_input")
    assert error["details"]["path"] == "$.input"


def test_a_key_without_the_workflows_role_is_403(workflow: Workflow) -> None:
    analyst = Api(api_key_for("bob", roles=("analyst",)))
    error = assert_error(analyst.post(RUNS, {"input": {"number": "SO-1"}}), 403, "role_not_held")
    assert error["details"]["role"] == "support"
    assert not Session.objects.exists()


def test_an_unknown_or_disabled_workflow_is_404(workflow: Workflow, support: Api) -> None:
    assert_error(support.post("/api/v1/workflows/nope/runs/", {"input": {}}), 404, "not_found")
    Workflow.objects.filter(pk=workflow.pk).update(enabled=False)
    assert_error(support.post(RUNS, {"input": {"number": "SO-1"}}), 404, "not_found")
    assert support.get("/api/v1/workflows/").json() == []


def test_a_repeated_idempotency_key_returns_the_first_run(workflow: Workflow, support: Api) -> None:
    body = {"input": {"number": "SO-1"}, "idempotency_key": "k-1"}
    first = support.post(RUNS, body)
    again = support.post(RUNS, body)

    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json()["id"] == again.json()["id"]
    assert Session.objects.count() == 1
    other = {"input": {"number": "SO-2"}, "idempotency_key": "k-1"}
    assert_error(support.post(RUNS, other), 409, "idempotency_key_reused")
    # Another user's key of the same name is theirs alone.
    carol = Api(api_key_for("carol", roles=("support",)))
    assert carol.post(RUNS, body).status_code == 201


def test_an_idempotency_key_header_returns_the_first_run(workflow: Workflow, support: Api) -> None:
    body = {"input": {"number": "SO-1"}}
    first = support.post(RUNS, body, HTTP_IDEMPOTENCY_KEY="run-1")
    again = support.post(RUNS, body, HTTP_IDEMPOTENCY_KEY="run-1")
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json() == first.json() and again["Idempotent-Replayed"] == "true"
    assert Session.objects.count() == 1
    reused = support.post(RUNS, {"input": {"number": "SO-2"}}, HTTP_IDEMPOTENCY_KEY="run-1")
    assert_error(reused, 409, "idempotency_key_reused")
    assert reused["x-should-retry"] == "false"
    assert Session.objects.count() == 1


def test_a_run_takes_no_messages(workflow: Workflow, support: Api) -> None:
    run = support.post(RUNS, {"input": {"number": "SO-1"}}).json()
    error = assert_error(
        support.post(f"/api/v1/sessions/{run['id']}/messages/", {"content": "hi"}),
        409,
        "not_a_conversation",
    )
    assert error["details"]["session"] == run["id"]
    assert Message.objects.filter(session_id=run["id"]).count() == 1  # the input only


def test_a_workflows_runtime_agent_is_no_conversational_agent(
    workflow: Workflow, support: Api
) -> None:
    slugs = [a["slug"] for a in support.get("/api/v1/agents/").json()]
    assert workflow.runtime_agent.slug not in slugs
    error = assert_error(
        support.post("/api/v1/sessions/", {"agent": workflow.runtime_agent.slug}),
        400,
        "unknown_agent",
    )
    assert error["details"] == {"field": "agent"}


def test_a_conversation_has_no_workflow(workflow: Workflow, support: Api) -> None:
    AgentFactory(slug="helper")
    created = support.post("/api/v1/sessions/", {"agent": "helper"}).json()
    assert created["workflow"] is None
    uuid.UUID(created["id"])


def test_the_schema_documents_the_run_operation_with_an_example(support: Api) -> None:
    schema = support.client.get("/api/v1/schema/", {"format": "json"}).json()
    operation = schema["paths"]["/api/v1/workflows/{slug}/runs/"]["post"]
    assert operation["summary"] == "Start a workflow run"
    assert {"201", "400", "403", "404", "409"} <= set(operation["responses"])
    body = operation["requestBody"]["content"]["application/json"]
    first = next(iter(body["examples"].values()))  # what Swagger UI's "Try it out" fills in
    assert first["value"]["input"] == {"order_number": "SO-1001"}


def test_a_runs_graph_is_svg_coloured_by_the_run(workflow: Workflow, support: Api) -> None:
    run = support.post(RUNS, {"input": {"number": "SO-1"}}).json()
    response = support.get(f"/api/v1/sessions/{run['id']}/graph/")

    assert response.status_code == 200
    assert response["Content-Type"].startswith("image/svg+xml")
    svg = response.content.decode()
    assert svg.startswith("<svg") and 'data-node="look"' in svg and "wf-active" in svg
    other = Api(api_key_for("mallory", roles=("support",)))
    assert_error(other.get(f"/api/v1/sessions/{run['id']}/graph/"), 404, "not_found")


def test_a_conversation_has_no_graph(workflow: Workflow, support: Api) -> None:
    AgentFactory(slug="helper")
    created = support.post("/api/v1/sessions/", {"agent": "helper"}).json()
    assert_error(support.get(f"/api/v1/sessions/{created['id']}/graph/"), 404, "not_a_workflow_run")


def test_the_graph_answers_whatever_the_client_accepts(workflow: Workflow, support: Api) -> None:
    run = support.post(RUNS, {"input": {"number": "SO-1"}}).json()
    path = f"/api/v1/sessions/{run['id']}/graph/"
    for accept in ("image/svg+xml", "*/*", "image/svg+xml, application/json;q=0.5"):
        response = support.client.get(path, HTTP_ACCEPT=accept)
        assert response.status_code == 200, accept
        assert response["Content-Type"].startswith("image/svg+xml"), accept
    missing = support.client.get(
        f"/api/v1/sessions/{uuid.uuid4()}/graph/", HTTP_ACCEPT="image/svg+xml"
    )
    assert_error(missing, 404, "not_found")


def test_the_graph_counts_against_the_keys_rate_like_every_read(
    workflow: Workflow, support: Api, settings: Any
) -> None:
    settings.API_RATE_LIMIT = 3
    settings.API_RATE_WINDOW_S = 40
    run = support.post(RUNS, {"input": {"number": "SO-1"}}).json()
    path = f"/api/v1/sessions/{run['id']}/graph/"
    # The run's start was the key's first request in this window.
    for _ in range(2):
        assert support.get(path).status_code == 200

    refused = support.get(path)

    assert_error(refused, 429, "rate_limited")
    # Whole seconds until the window ends: at least one, never past the 40 s window.
    retry_after = int(refused["Retry-After"])
    assert retry_after >= 1, retry_after
    assert retry_after <= 40, retry_after


def test_a_run_takes_a_webhook_the_egress_policy_allows_and_not_another(
    workflow: Workflow, support: Api, settings
) -> None:
    from hooks.models import RunWebhook

    started = support.post(
        RUNS, {"input": {"number": "SO-1"}, "webhook": {"url": "http://127.0.0.1:9/r"}}
    )
    assert started.status_code == 201, started.content
    assert list(RunWebhook.objects.values_list("session_id", "url")) == [
        (uuid.UUID(started.json()["id"]), "http://127.0.0.1:9/r")
    ]
    settings.EGRESS_ALLOW = []
    for hostile in ({"url": "http://127.0.0.1:9/r"}, {"url": "http://10.0.0.1/"}, {"uri": "x"}):
        error = assert_error(
            support.post(RUNS, {"input": {"number": "SO-2"}, "webhook": hostile}), 400
        )
        assert error["details"]["field"].startswith("webhook"), error
    assert Session.objects.count() == 1
