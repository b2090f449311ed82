"""Every operation documents its error responses, with the shared Error component."""

import pytest

pytestmark = pytest.mark.django_db

ERROR_REF = "#/components/schemas/Error"
# The OpenAI-compatible endpoint (openai_compat/) speaks OpenAI's protocol, errors included.
OPENAI_ERROR_REF = "#/components/schemas/OpenAIError"


@pytest.fixture
def schema(client) -> dict:  # type: ignore[no-untyped-def]
    response = client.get("/api/v1/schema/", {"format": "json"})
    assert response.status_code == 200, response.content
    return response.json()


def _errors(operation: dict) -> set[int]:
    return {int(code) for code in operation["responses"] if int(code) >= 400}


def test_the_error_component_is_the_public_error_shape(schema):
    components = schema["components"]["schemas"]
    error = components["Error"]
    assert error["required"] == ["error"]
    detail = components["ErrorDetail"]
    assert set(detail["properties"]) == {"code", "message", "details"}
    assert set(detail["required"]) == {"code", "message", "details"}
    assert detail["properties"]["details"]["type"] == "object"


def test_every_operation_documents_its_errors_with_the_error_component(schema):
    operations = [
        (method, path, op)
        for path, ops in schema["paths"].items()
        for method, op in ops.items()
        if method in {"get", "post", "put", "patch", "delete"}
    ]
    assert len(operations) >= 11
    for method, path, op in operations:
        # Every operation needs a key, and repeated failed keys from one address slow it down.
        assert {401, 429} <= _errors(op), (method, path)
        for code in _errors(op):
            response = op["responses"][str(code)]
            assert response["description"], (method, path, code)
            ref = OPENAI_ERROR_REF if path.startswith("/openai/") else ERROR_REF
            assert response["content"]["application/json"]["schema"] == {"$ref": ref}


def test_the_openai_error_component_is_openais_shape(schema):
    components = schema["components"]["schemas"]
    assert components["OpenAIError"]["required"] == ["error"]
    detail = components["OpenAIErrorObject"]
    assert set(detail["properties"]) == {"message", "type", "param", "code"}


@pytest.mark.parametrize(
    ("method", "path", "expected"),
    [
        # Query parameters only: bad input and auth.
        ("get", "/api/v1/sessions/", {400, 401, 429}),
        # A request body: bad input, too large, not JSON; a value above the key's grant.
        ("post", "/api/v1/sessions/", {400, 401, 403, 413, 415, 429}),
        # A resource in the path: it may not exist; no query, no body: no 400.
        ("get", "/api/v1/sessions/{session_id}/", {401, 404, 429}),
        ("get", "/api/v1/sessions/{session_id}/events/", {400, 401, 404, 429}),
        # Actions on a session: its state may forbid them; those that run a turn need
        # the session's role (403), stopping one does not.
        ("post", "/api/v1/sessions/{session_id}/cancel/", {401, 404, 409, 429}),
        ("post", "/api/v1/sessions/{session_id}/resume/", {401, 403, 404, 409, 429}),
        (
            "post",
            "/api/v1/sessions/{session_id}/messages/",
            {400, 401, 403, 404, 409, 413, 415, 429},
        ),
        ("post", "/api/v1/sessions/{session_id}/fork/", {400, 401, 403, 404, 409, 413, 415, 429}),
        (
            "post",
            "/openai/v1/chat/completions",
            {400, 401, 403, 404, 409, 413, 415, 429, 500, 502, 503},
        ),
        ("get", "/api/v1/tools/", {401, 429}),
        ("get", "/api/v1/agents/", {401, 429}),
    ],
)
def test_each_operation_documents_the_errors_it_can_give(schema, method, path, expected):
    assert _errors(schema["paths"][path][method]) == expected


def test_success_responses_stay_as_the_views_declare_them(schema):
    post_message = schema["paths"]["/api/v1/sessions/{session_id}/messages/"]["post"]
    assert post_message["responses"]["202"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/Message"
    }
    assert "201" in schema["paths"]["/api/v1/sessions/"]["post"]["responses"]


def test_a_messages_extra_context_is_documented_as_an_optional_object(schema):
    components = schema["components"]["schemas"]
    create = components["MessageCreateRequest"]
    extra = create["properties"]["extra_context"]
    assert extra["type"] == "object" and extra["nullable"] is True
    assert (
        "not as instructions" in extra["description"]
        or "never as instructions" in (extra["description"])
    )
    assert "extra_context" not in create.get("required", [])
    assert "extra_context" in components["Message"]["properties"]
    post = schema["paths"]["/api/v1/sessions/{session_id}/messages/"]["post"]
    assert {"400", "413"} <= set(post["responses"])
