"""openai_compat.api in process: every refusal comes before a turn starts, in OpenAI's error
shape with OpenAI's status; the models list. (Answers are tested on the live stack.)"""

import uuid
from typing import Any

import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from billing.services import account_ensure
from record.models import Event, Session
from tests.factories import AgentFactory, ModelEndpointFactory, SessionFactory, api_key_for

pytestmark = pytest.mark.django_db


def _session(**fields: Any) -> Session:
    session: Session = SessionFactory(**fields)  # type: ignore[assignment]
    return session


URL = "/openai/v1/chat/completions"
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture
def agent():  # type: ignore[no-untyped-def]
    return AgentFactory(slug="helper", model=ModelEndpointFactory(name="rules", api="rules"))


def _client(key: str | None) -> APIClient:
    client = APIClient()
    if key is not None:
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    return client


@pytest.fixture
def client(agent) -> APIClient:  # type: ignore[no-untyped-def]
    return _client(api_key_for("alice"))


def _error(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.content
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return dict(body["error"])


def test_no_key_or_a_bad_key_is_401_invalid_api_key(agent) -> None:  # type: ignore[no-untyped-def]
    for client in (_client(None), _client("ap_nope")):
        error = _error(client.post(URL, {"model": "helper", "messages": HI}, format="json"), 401)
        assert (error["type"], error["code"]) == ("authentication_error", "invalid_api_key")


def test_a_bad_body_is_400_naming_the_field(client: APIClient) -> None:
    error = _error(client.post(URL, {"model": "helper", "messages": []}, format="json"), 400)
    assert (error["type"], error["param"]) == ("invalid_request_error", "messages")
    response = client.generic("POST", URL, b"{oops", content_type="application/json")
    assert _error(response, 400)["code"] == "invalid_json"
    assert not Session.objects.exists()


def test_an_unknown_or_disabled_agent_is_404_model_not_found(client: APIClient) -> None:
    AgentFactory(slug="off", enabled=False, model=ModelEndpointFactory(name="rules"))
    for model in ("nobody", "off"):
        error = _error(client.post(URL, {"model": model, "messages": HI}, format="json"), 404)
        assert error["code"] == "model_not_found"


def test_a_session_not_yours_is_404_and_one_of_another_agent_400(client: APIClient, agent) -> None:  # type: ignore[no-untyped-def]
    theirs = _session(agent=agent)
    for session_id in (str(theirs.pk), str(uuid.uuid4()), "not-a-uuid"):
        response = client.post(
            URL, {"model": "helper", "messages": HI}, format="json", HTTP_X_SESSION_ID=session_id
        )
        assert _error(response, 404)["code"] == "session_not_found"
    other = AgentFactory(slug="other", model=agent.model)
    mine = _session(agent=other, owner=User.objects.get(username="alice"))
    response = client.post(
        URL, {"model": "helper", "messages": HI}, format="json", HTTP_X_SESSION_ID=str(mine.pk)
    )
    assert _error(response, 400)["param"] == "model"


def test_after_a_handoff_any_agent_of_the_chain_names_the_session(client: APIClient, agent) -> None:  # type: ignore[no-untyped-def]
    """The client keeps sending the `model` it started with (the Agents SDK does): the session
    goes on (here busy: 503, past the model check); an agent outside the chain is a 400."""
    billing = AgentFactory(slug="billing", model=agent.model)
    AgentFactory(slug="stranger", model=agent.model)
    handed = _session(agent=billing, owner=User.objects.get(username="alice"), state="processing")
    Event.objects.create(
        session=handed, seq=1, type="agent.changed",
        data={"from": "helper", "to": "billing", "reason": "invoices"},
    )  # fmt: skip
    for model in ("helper", "billing"):
        response = client.post(
            URL, {"model": model, "messages": HI}, format="json", HTTP_X_SESSION_ID=str(handed.pk)
        )
        assert _error(response, 503)["code"] == "session_busy"
    response = client.post(
        URL, {"model": "stranger", "messages": HI}, format="json", HTTP_X_SESSION_ID=str(handed.pk)
    )
    error = _error(response, 400)
    assert error["param"] == "model" and "billing, helper" in error["message"]


def test_a_tool_choice_naming_no_tool_of_the_request_or_the_agent_is_400(
    client: APIClient, agent
) -> None:  # type: ignore[no-untyped-def]
    body = {
        "model": "helper",
        "messages": HI,
        "tools": [{"type": "function", "function": {"name": "mine"}}],
        "tool_choice": {"type": "function", "function": {"name": "theirs"}},
    }
    error = _error(client.post(URL, body, format="json"), 400)
    assert error["param"] == "tool_choice.function.name" and "'theirs'" in error["message"]
    assert not Session.objects.exists()


def test_a_busy_session_is_503_with_retry_after(client: APIClient, agent) -> None:  # type: ignore[no-untyped-def]
    busy = _session(agent=agent, owner=User.objects.get(username="alice"), state="processing")
    response = client.post(
        URL, {"model": "helper", "messages": HI}, format="json", HTTP_X_SESSION_ID=str(busy.pk)
    )
    error = _error(response, 503)
    assert (error["type"], error["code"]) == ("server_error", "session_busy")
    assert response["Retry-After"] == "2"
    assert not response.has_header("x-should-retry")  # worth retrying: the turn ends
    assert busy.messages.count() == 0


@pytest.mark.parametrize("state", ["idle", "paused_for_user", "processing"])
def test_a_key_without_the_sessions_role_is_403_role_not_held(
    client: APIClient, agent, state: str
) -> None:  # type: ignore[no-untyped-def]
    """alice's admin key opened the session (role admin); her support-only key may not
    continue it, whether it is idle, asks the user, or is busy."""
    api_key_for("alice", roles=("admin", "support"))
    session = _session(
        agent=agent, owner=User.objects.get(username="alice"), role="admin", state=state
    )
    response = client.post(
        URL, {"model": "helper", "messages": HI}, format="json", HTTP_X_SESSION_ID=str(session.pk)
    )
    error = _error(response, 403)
    assert (error["type"], error["code"], error["param"]) == (
        "invalid_request_error",
        "role_not_held",
        None,
    )
    assert "'admin'" in error["message"]
    session.refresh_from_db()
    assert (session.state, session.version, session.messages.count()) == (state, 0, 0)


def test_no_credits_is_429_insufficient_quota_and_opens_no_session(client: APIClient) -> None:
    account_ensure(owner_id=User.objects.get(username="alice").pk)
    error = _error(client.post(URL, {"model": "helper", "messages": HI}, format="json"), 429)
    assert (error["type"], error["code"]) == ("insufficient_quota", "insufficient_quota")
    assert not Session.objects.exists()


def test_a_too_long_input_is_refused_before_a_session_opens(client: APIClient, settings) -> None:  # type: ignore[no-untyped-def]
    settings.MAX_MESSAGE_CHARS = 10
    messages = [{"role": "user", "content": "x" * 11}]
    response = client.post(URL, {"model": "helper", "messages": messages}, format="json")
    assert _error(response, 413)["code"] == "payload_too_large"
    assert not Session.objects.exists()


def test_accept_event_stream_is_not_refused(client: APIClient) -> None:
    response = client.post(
        URL, {"model": "nobody", "messages": HI}, format="json", HTTP_ACCEPT="text/event-stream"
    )
    assert _error(response, 404)["code"] == "model_not_found"


def test_the_models_are_the_enabled_agents(client: APIClient) -> None:
    AgentFactory(slug="off", enabled=False, model=ModelEndpointFactory(name="rules"))
    body = client.get("/openai/v1/models").json()
    assert body["object"] == "list"
    assert [(m["id"], m["object"], m["owned_by"]) for m in body["data"]] == [
        ("helper", "model", "agentplatform")
    ]
    assert client.get("/openai/v1/models/helper").json()["id"] == "helper"
    assert _error(client.get("/openai/v1/models/off"), 404)["code"] == "model_not_found"
    assert _error(_client(None).get("/openai/v1/models"), 401)["code"] == "invalid_api_key"


def test_a_nul_in_a_model_path_is_404_not_a_500(client: APIClient) -> None:
    assert _error(client.get("/openai/v1/models/a%00b"), 404)["code"] == "model_not_found"


def test_a_stateless_request_is_not_counted_as_a_session_created(settings) -> None:  # type: ignore[no-untyped-def]
    """Without X-Session-Id a request's session is ephemeral: clients that never send the
    header (LangChain, the Agents SDK) are held only to the request rate."""
    from openai_compat.api import ChatCompletionView

    throttles = {type(t).__name__ for t in ChatCompletionView().get_throttles()}
    assert throttles == {"ApiKeyRateThrottle"}


# Retried requests ---------------------------------------------------------------------------


def test_final_refusals_say_x_should_retry_false(client: APIClient) -> None:
    """The SDKs retry 409 and 429 by default: a refusal the same request would meet again
    says not to (a 400, a 404, no credits left)."""
    bad = client.post(URL, {"model": "helper", "messages": []}, format="json")
    unknown = client.post(URL, {"model": "nobody", "messages": HI}, format="json")
    account_ensure(owner_id=User.objects.get(username="alice").pk)
    broke = client.post(URL, {"model": "helper", "messages": HI}, format="json")
    assert [r.status_code for r in (bad, unknown, broke)] == [400, 404, 429]
    assert [r["x-should-retry"] for r in (bad, unknown, broke)] == ["false"] * 3


def _post(client: APIClient, content: str = "hi", **headers: str) -> Any:
    messages = [{"role": "user", "content": content}]
    return client.post(URL, {"model": "helper", "messages": messages}, format="json", **headers)


def test_the_same_idempotency_key_joins_the_first_requests_turn(client: APIClient) -> None:
    first = _post(client, HTTP_IDEMPOTENCY_KEY="chat-1")
    again = _post(client, HTTP_IDEMPOTENCY_KEY="chat-1")
    # The status waits for the turn (no worker here): the session says which turn it joined.
    assert first["X-Session-Id"] == again["X-Session-Id"]
    assert Session.objects.count() == 1
    assert Session.objects.get().messages.filter(role="user").count() == 1
    reused = _post(client, "bye", HTTP_IDEMPOTENCY_KEY="chat-1")
    error = _error(reused, 409)
    assert (error["type"], error["code"]) == ("invalid_request_error", "idempotency_key_reused")
    assert reused["x-should-retry"] == "false"
    assert Session.objects.count() == 1


def test_the_openai_sdks_retry_of_a_call_joins_its_first_attempts_turn(client: APIClient) -> None:
    """The openai SDK sends no key; it numbers its attempts (x-stainless-retry-count)."""
    sdk = {"HTTP_X_STAINLESS_RETRY_COUNT": "0", "HTTP_X_STAINLESS_READ_TIMEOUT": "5"}
    first = _post(client, **sdk)
    retry = _post(client, **{**sdk, "HTTP_X_STAINLESS_RETRY_COUNT": "1"})
    assert first["X-Session-Id"] == retry["X-Session-Id"]
    assert Session.objects.count() == 1
    # A new call with the same question is its first attempt: a turn of its own.
    assert _post(client, **sdk)["X-Session-Id"] != first["X-Session-Id"]
    # Without the SDK's numbers, the same body twice is two requests (two turns).
    _post(client)
    _post(client)
    assert Session.objects.count() == 4
