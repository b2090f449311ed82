"""A workflow version evaluated end to end: daphne + a Celery worker + beat. An app's key
starts a run of a quote workflow over REST (a read-only price lookup and a side-effecting
notice on HTTP business APIs in this process, an llm node on the strict fake
OpenAI-compatible server); the workflow then gets a second version that notifies another
customer. The app asks over REST for two evaluations of its finished runs: the recorded
version scores identical, the new one shows exactly the divergence (its notice "would have
been sent" to customer 8), and neither sent anything to either business API."""

import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import yaml

from record.models import ModelEndpoint, Session
from tests.e2e.support import api
from tests.e2e.test_workflows_e2e import RoutedApi, _http_tool
from tests.factories import api_key_for
from tests.fakes.fixtures import fake_servers  # noqa: F401 - the servers, started once per run
from tests.fakes.model_servers import FakeServers, Reply
from tests.stack import Stack
from tests.tools.http_server import Answer
from workflows.selectors import definition_check
from workflows.services import workflow_apply

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

QUOTE = """
slug: {slug}
role: support
model: {model}
input:
  type: object
  properties: {{sku: {{type: string}}, customer: {{type: integer}}}}
  required: [sku, customer]
start: price
result: answer
nodes:
  price: {{kind: tool, tool: price_of, args: {{sku: input.sku}}, output: priced, next: tell}}
  tell: {{kind: llm, prompt: "Say what {{{{ input.sku }}}} costs", output: answer, next: notify}}
  notify: {{kind: tool, tool: send_notice, args: {{customer: {customer}}}, output: sent, next: end}}
"""


@pytest.fixture
def fakes(fake_servers: FakeServers) -> Iterator[FakeServers]:  # noqa: F811
    fake_servers.reset()
    yield fake_servers
    errors = fake_servers.openai.errors
    violations = fake_servers.openai.violations
    fake_servers.reset()
    assert not errors, errors
    assert not violations, violations


def _until(check: Any, what: str, timeout_s: float = 90.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _evaluate(client: httpx.Client, candidate: str) -> dict[str, Any]:
    created = client.post(
        "/api/v1/evaluations/",
        json={"filter": {"outcome": "finished"}, "candidate": {"workflow_version": candidate}},
    )
    assert created.status_code == 201, created.text
    url = f"/api/v1/evaluations/{created.json()['id']}/"
    report: dict[str, Any] = _until(
        lambda: (r := client.get(url).json())["state"] in ("finished", "failed") and r,
        "the evaluation",
    )
    return report


def test_a_workflow_version_evaluated_over_rest_shows_its_divergence_and_sends_nothing(
    live_stack: Stack, fakes: FakeServers
) -> None:
    endpoint = ModelEndpoint.objects.create(
        name=f"e2e-wf-eval-{uuid.uuid4().hex[:8]}",
        api="openai",
        base_url=fakes.openai.base_url,
        model="fake-openai",
        first_token_timeout_s=5,
        total_timeout_s=20,
    )
    slug = f"quote-{uuid.uuid4().hex[:6]}"

    def apply(customer: str) -> None:
        text = QUOTE.format(slug=slug, model=endpoint.name, customer=customer)
        raw = yaml.safe_load(text)
        workflow_apply(definition=definition_check(raw, where="t"), where="t")

    prices = RoutedApi(lambda seen: Answer(200, {"sku": seen.body["sku"], "price": 42}))
    notices = RoutedApi(lambda seen: Answer(200, {"sent_to": seen.body["customer"]}))
    with prices, notices:
        _http_tool("price_of", prices.url("/price"), {"sku": {"type": "string"}})
        _http_tool(
            "send_notice", notices.url("/notices"), {"customer": {"type": "integer"}},
            side_effects=True,
        )  # fmt: skip
        apply("input.customer")
        key = api_key_for("wf-eval-app")
        fakes.openai.script(Reply(text="MUG-1 costs 42."))
        with api(live_stack, key) as client:
            started = client.post(
                f"/api/v1/workflows/{slug}/runs/", json={"input": {"sku": "MUG-1", "customer": 7}}
            )
            assert started.status_code == 201, started.text
            run = started.json()["id"]
            _until(
                lambda: Session.objects.filter(pk=run, state="finished").exists(),
                "the recorded run",
            )
            assert (len(prices.requests), len(notices.requests)) == (1, 1)
            apply("input.customer + 1")  # version 2: the notice goes to customer 8

            fakes.openai.script(Reply(text="MUG-1 costs 42."))
            same = _evaluate(client, f"{slug}@1")
            fakes.openai.script(Reply(text="MUG-1 costs 42."))
            other = _evaluate(client, f"{slug}@2")

    assert same["state"] == "finished", same
    assert same["progress"] == {"done": 1, "total": 1}
    for share in ("trajectory_match", "outcome_match", "answer_exact", "answer_similarity"):
        assert same["totals"][share] == 1.0, (share, same["totals"])
    (turn,) = same["turns"]
    assert turn["session"] == run
    assert turn["baseline"]["path"] == turn["candidate"]["path"] == ["price", "tell", "notify"]
    assert turn["candidate"]["output"] == "MUG-1 costs 42."

    assert other["state"] == "finished", other
    (turn,) = other["turns"]
    assert turn["trajectory_match"] is False and turn["outcome_match"] is False
    assert turn["baseline"]["path"] == turn["candidate"]["path"] == ["price", "tell", "notify"]
    assert (turn["baseline"]["outcome"], turn["candidate"]["outcome"]) == ("finished", "failed")
    assert turn["candidate"]["calls"][-1] == {"tool": "send_notice", "arguments": {"customer": 8}}
    assert turn["candidate"]["would_have_called"] == [
        {"tool": "send_notice", "arguments": {"customer": 8}}
    ]
    assert other["totals"]["would_have_called"] == 1
    # Nothing was sent: each business API saw the recorded run's one request only.
    assert (len(prices.requests), len(notices.requests)) == (1, 1)
