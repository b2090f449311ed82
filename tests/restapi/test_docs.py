"""The API's documentation: every operation is described for a customer's developer, and
the websocket page names everything the websockets can send or take.

The lists checked against the websocket page come from the code (the event types, the
consumers' close-code constants, the error codes and client frame types in their
source), so a new one the page does not mention fails here.
"""

import ast
import inspect
import re
from collections.abc import Iterator
from typing import Any

import pytest

import approvals.consumers
import sessions.consumers
from record.events import EventType
from restapi.docs import WEBSOCKET_PAGE

pytestmark = pytest.mark.django_db

HTTP_METHODS = {"get", "post", "put", "patch", "delete"}

# Words that name the platform's insides, not what a customer's developer sees.
INTERNAL = [
    r"\brelay\b",
    r"\bcelery\b",
    r"\bredis\b",
    r"\bdjango\b",
    r"\bserializer\b",
    r"\bqueryset\b",
    r"select_for_update",
    r"\bsessions_\w+",  # table names
    r"\bToolCall\b",
    r"\w+\.py\b",  # module files
    # The platform's module paths (sessions.services.grants, relay.answer)
    r"\b(?:sessions|engine|approvals|billing|tools|workflows|accounts|restapi|openai_compat"
    r"|runtime|llm|memory|configuration|demo|observability|audit|relay|wire)\.[a-z_]+",
    r"\b[A-Z][A-Z0-9]+(?:_[A-Z0-9]+)+\b",  # settings names (EVENTS_PAGE_MAX_BYTES)
    r"\btasks?\.\w+",
]


@pytest.fixture
def schema(client) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    response = client.get("/api/v1/schema/", {"format": "json"})
    assert response.status_code == 200
    return dict(response.json())


def _operations(schema: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, item in schema["paths"].items():
        for method, operation in item.items():
            if method in HTTP_METHODS:
                yield method, path, operation


def _texts(node: Any, where: str = "$") -> Iterator[tuple[str, str]]:
    """Every summary, description and title anywhere in the schema."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("summary", "description", "title") and isinstance(value, str):
                yield f"{where}.{key}", value
            else:
                yield from _texts(value, f"{where}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _texts(value, f"{where}[{i}]")


def test_every_operation_and_parameter_is_described(schema):
    problems = []
    for method, path, operation in _operations(schema):
        summary = (operation.get("summary") or "").strip()
        description = (operation.get("description") or "").strip()
        if not summary or len(summary) > 60 or summary.endswith("."):
            problems.append(f"{method} {path}: summary {summary!r}")
        if len(description) < 80:
            problems.append(f"{method} {path}: description {description!r}")
        for parameter in operation.get("parameters", []):
            if not parameter.get("description"):
                problems.append(f"{method} {path}: parameter {parameter['name']}")
    assert problems == []


def test_every_request_body_and_json_answer_has_an_example(schema):
    problems = []
    for method, path, operation in _operations(schema):
        body = operation.get("requestBody", {}).get("content", {}).get("application/json")
        if body is not None and not body.get("examples"):
            problems.append(f"{method} {path}: request body")
        for status, response in operation["responses"].items():
            content = response.get("content", {}).get("application/json")
            if operation["tags"] == ["openai"] and not status.startswith("2"):
                continue  # OpenAI's own error shape: described, not exemplified
            if content is not None and not content.get("examples"):
                problems.append(f"{method} {path}: {status} response")
    assert problems == []


def test_an_error_example_has_the_one_error_shape(schema):
    for method, path, operation in _operations(schema):
        if operation["tags"] == ["openai"]:
            continue
        for status, response in operation["responses"].items():
            if status.startswith("2"):
                continue
            for name, example in response["content"]["application/json"]["examples"].items():
                error = example["value"]["error"]
                assert set(error) == {"code", "message", "details"}, (method, path, name)
                assert re.fullmatch(r"[a-z_]+", error["code"]), (method, path, name)


def test_no_text_names_the_platforms_insides(schema):
    found = [
        (where, pattern, text[:120])
        for where, text in _texts(schema)
        for pattern in INTERNAL
        if re.search(pattern, text)
    ]
    assert found == []


def test_the_first_request_example_opens_a_session_on_the_demo_agent(schema):
    """Swagger UI's "Try it out" fills in the first example: it must name a real agent."""
    body = schema["paths"]["/api/v1/sessions/"]["post"]["requestBody"]["content"]
    first = next(iter(body["application/json"]["examples"].values()))
    assert first["value"]["agent"] == "order-support"


def test_the_overview_links_the_websocket_page(schema, client):
    assert f"]({WEBSOCKET_PAGE})" in schema["info"]["description"]
    assert client.get(WEBSOCKET_PAGE).status_code == 200


# The websocket page -----------------------------------------------------------------------

CONSUMERS = [sessions.consumers, approvals.consumers]
# Methods of the consumers whose first argument is the error frame's code.
ERROR_SENDERS = {"_send_error", "_fail", "_refuse", "_close_for"}


def _close_codes() -> set[int]:
    return {
        value
        for module in CONSUMERS
        for name, value in vars(module).items()
        if name.startswith("CLOSE_") and isinstance(value, int)
    }


def _error_codes() -> set[str]:
    """Every error code a consumer's source sends: the first argument of its error senders,
    and the `code` of an error frame built in place."""
    codes = set()
    for module in CONSUMERS:
        for node in ast.walk(ast.parse(inspect.getsource(module))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ERROR_SENDERS
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                codes.add(node.args[0].value)
            if isinstance(node, ast.Dict):
                for key, value in zip(node.keys, node.values, strict=True):
                    if (
                        isinstance(key, ast.Constant)
                        and key.value == "code"
                        and isinstance(value, ast.Constant)
                    ):
                        codes.add(value.value)
    return codes


def _client_frame_types() -> set[str]:
    """The `type`s the sessions consumer's receive() acts on (`kind == "..."`)."""
    receive = ast.parse(inspect.getsource(sessions.consumers.SessionConsumer.receive).strip())
    return {
        node.comparators[0].value
        for node in ast.walk(receive)
        if isinstance(node, ast.Compare)
        and isinstance(node.left, ast.Name)
        and node.left.id == "kind"
        and isinstance(node.comparators[0], ast.Constant)
    }


@pytest.fixture
def page(client) -> str:  # type: ignore[no-untyped-def]
    response = client.get(WEBSOCKET_PAGE)
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/html")
    return str(response.content.decode())


def test_the_lists_from_the_code_are_not_empty():
    """The derivations below still find what they look for (a rename would empty them)."""
    assert {4400, 4401, 4403, 4404, 4429} <= _close_codes()
    assert {"not_authenticated", "key_revoked", "malformed_frame", "not_found"} <= _error_codes()
    assert _client_frame_types() == {"user_message", "interrupt"}


def test_the_page_names_every_event_type(page):
    missing = [t.value for t in EventType if f"<code>{t.value}</code>" not in page]
    assert missing == []


def test_the_page_names_every_close_code(page):
    missing = [code for code in _close_codes() if f"<td>{code}</td>" not in page]
    assert missing == []


def test_the_page_names_every_error_code_a_socket_sends(page):
    missing = sorted(code for code in _error_codes() if f"<code>{code}</code>" not in page)
    assert missing == []


def test_the_page_names_every_client_frame_and_the_sign_in(page):
    for kind in _client_frame_types():
        assert f'{{"type": "{kind}"' in page, kind
    assert sessions.consumers.WS_SUBPROTOCOL in page
    assert f'"{sessions.consumers.KEY_SUBPROTOCOL_PREFIX}' in page
    assert f"{sessions.consumers.MAX_FRAME_BYTES // 1024} KiB" in page
    for part in ("?after=", "?token=", "Authorization: Bearer"):
        assert part in page, part
