"""Retried requests on the live stack, with the client libraries at their default retries
(the openai SDK's `max_retries=2`, under LangChain's ChatOpenAI and the Agents SDK too): one
request sends its side effect once, when the model dies after the tool ran (a final 502,
`x-should-retry: false`) and when the client's first attempt times out (its retry joins
the running turn); an `Idempotency-Key` returns the first answer without a new turn."""

import json
import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import openai
import pytest
from django.conf import settings

from record.models import Agent, ModelEndpoint, Session
from tests.factories import AgentFactory, ToolFactory, api_key_for
from tests.fakes.fixtures import fake_servers, openai_server  # noqa: F401 - fixtures
from tests.fakes.model_servers import Call, FakeModelServer, Reply
from tests.stack import Stack, running_stack

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


class Notifier:
    """A side-effecting HTTP service: each POST notifies a customer (counted)."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        notifier = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                length = int(self.headers.get("Content-Length") or 0)
                notifier.sent.append(json.loads(self.rfile.read(length) or b"{}"))
                body = json.dumps({"sent": True}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/notify"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def notifier() -> Iterator[Notifier]:
    service = Notifier()
    yield service
    service.close()


@pytest.fixture
def key() -> str:
    return api_key_for(f"rt-{uuid.uuid4().hex[:8]}")


@pytest.fixture
def notifying_agent(openai_server: FakeModelServer, notifier: Notifier) -> str:  # noqa: F811
    tool = f"notify_{uuid.uuid4().hex[:6]}"
    ToolFactory(
        name=tool,
        kind="http",
        url=notifier.url,
        method="POST",
        side_effects=True,
        timeout_s=5,
        parameters={
            "type": "object",
            "properties": {"customer_id": {"type": "integer"}},
            "required": ["customer_id"],
        },
    )
    endpoint = ModelEndpoint.objects.create(
        name=f"rt-{uuid.uuid4().hex[:8]}",
        api="openai",
        base_url=openai_server.base_url,
        model="fake-model",
        first_token_timeout_s=10,
        total_timeout_s=20,
    )
    slug = f"notifier-{uuid.uuid4().hex[:8]}"
    AgentFactory(slug=slug, model=endpoint, tools=[tool])
    return slug


def _tool(slug: str) -> str:
    return str(Agent.objects.get(slug=slug).tools[0])


def _script_tool_then(server: FakeModelServer, slug: str, *after: Reply) -> None:
    server.reset()  # what an earlier turn left unused
    server.script(Reply(calls=[Call(_tool(slug), {"customer_id": 7}, id="call_1")]), *after)


def _base(stack: Stack) -> str:
    return f"{stack.http}/openai/v1"


def _turns(slug: str) -> int:
    return Session.objects.filter(agent__slug=slug).count()


# The worker is killed mid-turn, after the tool ran ------------------------------------------


def test_the_openai_sdk_at_its_defaults_notifies_once_when_the_worker_is_killed_mid_turn(
    key,
    notifying_agent,
    notifier,
    openai_server,  # noqa: F811
):
    """The worker dies in the model call after the side effect: the request stays open on
    the web process, the sweeper hands the run to another worker once its lease lapses, the
    recorded call is not sent again, and the one request gets the answer."""
    _script_tool_then(
        openai_server, notifying_agent, Reply(hang=True), Reply(text="Customer 7 is notified.")
    )
    # A stack of its own (and a queue of its own), so the shared live stack keeps its worker.
    extra = {"SESSION_LEASE_S": "3", "CELERY_QUEUE": f"agentplatform-rt-kill-{os.getpid()}"}
    with running_stack(extra_env=extra) as stack:
        client = openai.OpenAI(base_url=_base(stack), api_key=key)  # the default retries
        answered: dict[str, Any] = {}

        def ask() -> None:
            try:
                answered["completion"] = client.chat.completions.create(
                    model=notifying_agent,
                    messages=[{"role": "user", "content": "notify customer 7"}],
                )
            except openai.APIError as exc:  # shown by the assertion below
                answered["error"] = exc

        asking = threading.Thread(target=ask, daemon=True)
        asking.start()
        deadline = time.monotonic() + 60
        while len(openai_server.requests) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)  # the second model call hangs: the worker is inside it
        assert len(notifier.sent) == 1, stack.log_tail("worker")
        stack.stop("worker", signal.SIGKILL)
        stack.start_worker("worker2")
        asking.join(120)
        assert "completion" in answered, (answered, stack.log_tail("worker2"))
        assert answered["completion"].choices[0].message.content == "Customer 7 is notified."
    assert (len(notifier.sent), _turns(notifying_agent)) == (1, 1)
    assert len(openai_server.requests) == 3  # the lost model call, asked again; no tool again


# The model dies after the tool ran: a final 502, not retried --------------------------------

DEAD = [Reply(status=500)] * 6  # the step's call, its retry and any fallback: all fail


def test_the_openai_sdk_at_its_defaults_notifies_once_when_the_model_dies_after_the_tool(
    live_stack,
    key,
    notifying_agent,
    notifier,
    openai_server,  # noqa: F811
):
    _script_tool_then(openai_server, notifying_agent, *DEAD)
    client = openai.OpenAI(base_url=_base(live_stack), api_key=key)  # max_retries: the default
    assert client.max_retries == 2
    with pytest.raises(openai.InternalServerError) as failed:
        client.chat.completions.create(
            model=notifying_agent, messages=[{"role": "user", "content": "notify customer 7"}]
        )
    assert failed.value.status_code == 502
    assert failed.value.response.headers["x-should-retry"] == "false"
    assert (len(notifier.sent), _turns(notifying_agent)) == (1, 1), live_stack.log_tail("worker")


def test_langchain_and_the_agents_sdk_at_their_defaults_notify_once_too(
    live_stack,
    key,
    notifying_agent,
    notifier,
    openai_server,  # noqa: F811
):
    from agents import Agent as SdkAgent
    from agents import OpenAIChatCompletionsModel, Runner, set_tracing_disabled
    from langchain_openai import ChatOpenAI

    _script_tool_then(openai_server, notifying_agent, *DEAD)
    chat = ChatOpenAI(model=notifying_agent, base_url=_base(live_stack), api_key=key)
    with pytest.raises(openai.InternalServerError):
        chat.invoke("notify customer 7")
    assert (len(notifier.sent), _turns(notifying_agent)) == (1, 1)

    _script_tool_then(openai_server, notifying_agent, *DEAD)
    set_tracing_disabled(True)
    model = OpenAIChatCompletionsModel(
        model=notifying_agent,
        openai_client=openai.AsyncOpenAI(base_url=_base(live_stack), api_key=key),
    )
    with pytest.raises(openai.InternalServerError):
        Runner.run_sync(SdkAgent(name="support", model=model), "notify customer 7")
    assert (len(notifier.sent), _turns(notifying_agent)) == (2, 2)


# The first attempt times out: the retry joins the running turn -----------------------------

# The answer comes 5 s after the tool ran: an attempt times out at 4 s, and the SDK's three
# attempts (with its pauses) span about 13 s, room for a loaded machine's slower turn.
SLOW = Reply(text="Customer 7 is notified.", first_delay_s=5.0)
TIMEOUT_S = 4.0


def test_the_openai_sdks_retry_after_a_timeout_joins_the_turn_it_left(
    live_stack,
    key,
    notifying_agent,
    notifier,
    openai_server,  # noqa: F811
):
    _script_tool_then(openai_server, notifying_agent, SLOW)
    client = openai.OpenAI(base_url=_base(live_stack), api_key=key, timeout=TIMEOUT_S)
    answer = client.chat.completions.create(
        model=notifying_agent, messages=[{"role": "user", "content": "notify customer 7"}]
    )
    assert answer.choices[0].message.content == "Customer 7 is notified."
    assert answer.usage is not None and answer.usage.total_tokens > 0
    assert (len(notifier.sent), _turns(notifying_agent)) == (1, 1), live_stack.log_tail("web")
    assert Session.objects.get(agent__slug=notifying_agent).state == "finished"


def test_langchain_and_the_agents_sdk_retries_after_a_timeout_join_the_turn_too(
    live_stack,
    key,
    notifying_agent,
    notifier,
    openai_server,  # noqa: F811
):
    from agents import Agent as SdkAgent
    from agents import OpenAIChatCompletionsModel, Runner, set_tracing_disabled
    from langchain_openai import ChatOpenAI

    _script_tool_then(openai_server, notifying_agent, SLOW)
    chat = ChatOpenAI(
        model=notifying_agent, base_url=_base(live_stack), api_key=key, timeout=TIMEOUT_S
    )
    assert chat.invoke("notify customer 7").content == "Customer 7 is notified."
    assert (len(notifier.sent), _turns(notifying_agent)) == (1, 1)

    _script_tool_then(openai_server, notifying_agent, SLOW)
    set_tracing_disabled(True)
    model = OpenAIChatCompletionsModel(
        model=notifying_agent,
        openai_client=openai.AsyncOpenAI(
            base_url=_base(live_stack), api_key=key, timeout=TIMEOUT_S
        ),
    )
    result = Runner.run_sync(SdkAgent(name="support", model=model), "notify customer 7")
    assert result.final_output == "Customer 7 is notified."
    assert (len(notifier.sent), _turns(notifying_agent)) == (2, 2)


def test_a_streamed_retry_with_the_same_key_re_attaches_to_the_turn(
    live_stack,
    key,
    notifying_agent,
    notifier,
    openai_server,  # noqa: F811
):
    """The client's own key: the first streamed attempt is cut by the client mid-turn; the
    retry with the key streams the same turn's answer, and a later one replays it."""
    _script_tool_then(openai_server, notifying_agent, SLOW)
    body = {
        "model": notifying_agent,
        "stream": True,
        "messages": [{"role": "user", "content": "notify customer 7"}],
    }
    headers = {"Authorization": f"Bearer {key}", "Idempotency-Key": "notify-7"}
    url = f"{_base(live_stack)}/chat/completions"
    with (
        pytest.raises(httpx.ReadTimeout),
        httpx.stream("POST", url, headers=headers, json=body, timeout=TIMEOUT_S) as first,
    ):
        first.read()

    def streamed() -> str:
        with httpx.stream("POST", url, headers=headers, json=body, timeout=30) as response:
            assert response.status_code == 200
            lines = [line for line in response.iter_lines() if line.startswith("data: {")]
        return "".join(
            chunk["choices"][0]["delta"].get("content") or ""
            for chunk in map(lambda line: json.loads(line[len("data: ") :]), lines)
            if chunk.get("choices")
        )

    assert streamed() == "Customer 7 is notified."
    assert streamed() == "Customer 7 is notified."  # the turn has ended: its answer again
    assert (len(notifier.sent), _turns(notifying_agent)) == (1, 1)
    other = httpx.post(
        url, headers=headers, json={**body, "stream": False}, timeout=10
    )  # another body, the same key
    assert (other.status_code, other.json()["error"]["code"]) == (409, "idempotency_key_reused")
    assert other.headers["x-should-retry"] == "false"


def test_a_client_that_may_retry_and_does_not_still_cancels_its_turn_after_the_grace(
    live_stack,
    key,
    notifying_agent,
    openai_server,  # noqa: F811
):
    """Gone without a retry (a key sent, nobody came back): the turn is cancelled, as for any
    client that goes away, once IDEMPOTENCY_RETRY_GRACE_S passed without a re-attach."""
    openai_server.reset()
    # Longer than the grace: the turn is still running when it runs out.
    words = " ".join(["one"] + ["more"] * 24)
    openai_server.script(Reply(text=words, delay_s=0.8))
    body = {
        "model": notifying_agent,
        "stream": True,
        "messages": [{"role": "user", "content": "count slowly"}],
    }
    headers = {"Authorization": f"Bearer {key}", "Idempotency-Key": f"gone-{uuid.uuid4()}"}
    left = time.monotonic()
    with httpx.stream(
        "POST", f"{_base(live_stack)}/chat/completions", headers=headers, json=body, timeout=30
    ) as response:
        session_id = response.headers["x-session-id"]
        for line in response.iter_lines():
            if '"content":' in line and "one" in line:
                left = time.monotonic()
                break
    grace = settings.IDEMPOTENCY_RETRY_GRACE_S
    rows = Session.objects.filter(pk=session_id).values_list("state", flat=True)
    while rows.get() != "cancelled":
        assert time.monotonic() < left + grace + 30, (rows.get(), live_stack.log_tail("web"))
        time.sleep(0.2)
    # Not at once: a retry had the grace to re-attach.
    assert time.monotonic() - left >= grace - 1
