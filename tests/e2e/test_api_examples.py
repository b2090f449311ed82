"""The schema's request examples work: each one, sent to the live server with the demo's
configuration applied (as `make run` sets it up), gets a 2xx the operation documents.

Every operation is either sent (each of its request examples, or once without a body)
or named in NOT_SENT with the reason, so a new operation must be thought about here.
Ids the examples cannot know (a session, a workflow run) are made first, through the
examples themselves.
"""

from typing import Any

import httpx
import pytest

from accounts.services import approver_grant
from tests.demo_setup import demo_install
from tests.e2e.support import api, turns_finished, wait_events
from tests.factories import api_key_for
from tests.stack import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

# Decisions on an approval, and resuming a failed run: they change something that must
# first be brought into a state the fresh demo does not have. Their behaviour is covered
# by tests/e2e/test_approvals_e2e.py and the durability tests.
NOT_SENT = {
    ("post", "/api/v1/approvals/{approval_id}/approve/"): "needs a pending approval",
    ("post", "/api/v1/approvals/{approval_id}/reject/"): "needs a pending approval",
    ("post", "/api/v1/approvals/{approval_id}/review/"): "needs a recovery review",
    ("post", "/api/v1/approvals/{approval_id}/withdraw/"): "needs a decided approval",
    ("post", "/api/v1/approvals/{approval_id}/change/"): "needs a decided approval",
    ("post", "/api/v1/sessions/{session_id}/resume/"): "needs a session in error",
    ("post", "/api/v1/evaluations/{evaluation_id}/cancel/"): "needs an evaluation still running",
}


def _successes(operation: dict[str, Any]) -> set[int]:
    return {int(status) for status in operation["responses"] if status.startswith("2")}


def _request_examples(operation: dict[str, Any]) -> list[Any]:
    content = operation.get("requestBody", {}).get("content", {}).get("application/json", {})
    return [example["value"] for example in content.get("examples", {}).values()]


def _path_example(operation: dict[str, Any], name: str) -> str | None:
    for parameter in operation.get("parameters", []):
        if parameter["in"] == "path" and parameter["name"] == name and parameter.get("examples"):
            return str(next(iter(parameter["examples"].values()))["value"])
    return None


class Demo:
    """The live server, the keys, and the ids the examples' paths need."""

    def __init__(self, stack: Stack, schema: dict[str, Any]) -> None:
        self.client = api(stack, api_key_for("docs-reader"))
        approver_grant(username="docs-approver")
        self.approver = api(stack, api_key_for("docs-approver"))
        self.schema = schema

    def send(self, method: str, path: str, operation: dict[str, Any], body: Any = None) -> Any:
        client = self.approver if path.startswith("/api/v1/approvals/") else self.client
        response = client.request(method.upper(), path, json=body)
        assert response.status_code in _successes(operation), (method, path, body, response.text)
        if response.headers.get("content-type", "").startswith("application/json"):
            return response.json()
        return response.text

    def example(self, method: str, path: str, index: int = 0) -> Any:
        return _request_examples(self.schema["paths"][path][method])[index]

    def new_session(self) -> str:
        path = "/api/v1/sessions/"
        created = self.send(
            "post", path, self.schema["paths"][path]["post"], self.example("post", path)
        )
        return str(created["id"])


@pytest.fixture
def demo(live_stack: Stack) -> Demo:
    demo_install()
    schema = httpx.get(f"{live_stack.http}/api/v1/schema/", params={"format": "json"}).json()
    return Demo(live_stack, schema)


def test_every_documented_request_example_works_on_the_demo(demo: Demo) -> None:
    paths = demo.schema["paths"]
    # A conversation whose first turn has ended (its checkpoints exist, it can be forked),
    # through the messages example.
    conversation = demo.new_session()
    messages = "/api/v1/sessions/{session_id}/messages/"
    demo.send(
        "post",
        messages.format(session_id=conversation),
        paths[messages]["post"],
        demo.example("post", messages),
    )
    wait_events(demo.client, conversation, turns_finished(1), timeout=60)
    # A workflow run, through the runs example.
    runs = "/api/v1/workflows/{slug}/runs/"
    slug = _path_example(paths[runs]["post"], "slug")
    run = demo.send(
        "post", runs.format(slug=slug), paths[runs]["post"], demo.example("post", runs)
    )["id"]

    examples_sent = 0
    operations_sent = set()
    made: dict[str, str] = {}  # ids the examples made on the way (an evaluation's)
    for path, item in paths.items():
        for method, operation in item.items():
            if (method, path) in NOT_SENT:
                continue
            operations_sent.add((method, path))
            ids = {
                # A workflow run's graph; every other session operation on the conversation.
                "session_id": run if path.endswith("/graph/") else conversation,
                "slug": _path_example(operation, "slug"),
                "model": _path_example(operation, "model"),
                **made,
            }
            if path == "/api/v1/evaluations/" and method == "post":
                # The examples' session stands for one of yours: the conversation.
                for body in _request_examples(operation):
                    evaluation = demo.send(
                        method, path, operation, {**body, "sessions": [conversation]}
                    )
                    made["evaluation_id"] = str(evaluation["id"])
                    examples_sent += 1
                continue
            if path == messages and method == "post":
                # Each message example on a fresh session, as a client would send it.
                for body in _request_examples(operation):
                    demo.send(method, path.format(session_id=demo.new_session()), operation, body)
                    examples_sent += 1
                continue
            url = path.format(**{k: v for k, v in ids.items() if v is not None})
            assert "{" not in url, (method, path)
            bodies = _request_examples(operation)
            for body in bodies or [None]:
                demo.send(method, url, operation, body)
                examples_sent += body is not None

    every_operation = {(m, p) for p, item in paths.items() for m in item}
    assert operations_sent == every_operation - set(NOT_SENT)
    every_example = sum(len(_request_examples(paths[p][m])) for m, p in operations_sent)
    assert examples_sent == every_example > 0
