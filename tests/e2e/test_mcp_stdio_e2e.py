"""A published stdio MCP server through the real Celery worker: `mcp-server-time` (PyPI, a dev
dependency; it needs no network), started by the worker on the first call and kept for the
next, and started again after it was killed mid-session. The model is a fake OpenAI server of
the test's own; it checks that the server's answer reached it."""

import re
import signal
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import psutil
import pytest
from django.contrib.auth import get_user_model

from audit.models import AuditEntry
from record.models import ModelEndpoint
from tests.e2e.support import (
    api,
    create_session,
    get_messages,
    post_message,
    stack_logs,
    turns_finished,
    wait_events,
)
from tests.factories import AgentFactory, api_key_for
from tests.fakes.model_servers import Call, FakeModelServer, Recorded, Reply
from tests.stack import BIN, Stack
from tools.models import McpServer, Tool
from tools.services import mcp_server_refresh

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

SERVER = str(BIN / "mcp-server-time")


@pytest.fixture
def model() -> Iterator[FakeModelServer]:
    """A model server of the test's own: no run left from another test takes its replies."""
    with FakeModelServer("openai") as server:
        yield server
    assert not server.errors, server.errors


@pytest.fixture
def time_agent(model: FakeModelServer) -> tuple[str, str]:
    """(agent slug, MCP server name): an agent whose tools are mcp-server-time's."""
    name = f"time{uuid.uuid4().hex[:8]}"
    server = McpServer.objects.create(name=name, command=[SERVER], roles=["support"], timeout_s=10)
    mcp_server_refresh(server=server)
    endpoint = ModelEndpoint.objects.create(
        name=f"mcp-e2e-{name}",
        api="openai",
        base_url=model.base_url,
        model="fake-model",
        first_token_timeout_s=5,
        total_timeout_s=20,
    )
    slug = f"agent-{name}"
    AgentFactory(slug=slug, model=endpoint, tools=[f"{name}.get_current_time"])
    return slug, name


def _time_servers(stack: Stack) -> set[int]:
    """The worker's mcp-server-time processes."""
    worker = psutil.Process(stack.procs["worker"].pid)
    found = set()
    for child in worker.children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE and SERVER in " ".join(child.cmdline()):
                found.add(child.pid)
        except psutil.NoSuchProcess:
            pass
    return found


def _ask_time(model: FakeModelServer, server: str, zone: str) -> None:
    """The model's side of one turn: call get_current_time, then answer with what came back."""

    def answer(request: Recorded) -> Reply:
        shown = str(request.last_tool_result())
        # The server's own answer (rendered for the model), not a failure the platform wrote.
        found = re.search(rf"timezone: {zone}, datetime: (\S+),", shown)
        assert found, shown
        return Reply(text=f"The time there: {found[1]}.")

    model.script(
        Reply(calls=[Call(f"{server}__get_current_time", {"timezone": zone}, id="call_1")]),
        answer,
    )


def _turn(stack: Stack, client: Any, session_id: str, count: int, text: str) -> list[Any]:
    post_message(client, session_id, text)
    return wait_events(
        client,
        session_id,
        turns_finished(count),
        timeout=45,
        describe=stack_logs(stack, "worker"),
    )


def _tool_statuses(events: list[Any]) -> list[str]:
    return [e["data"]["status"] for e in events if e["type"] == "tool.finished"]


def test_an_agent_calls_a_published_stdio_server_through_the_worker(live_stack, model, time_agent):
    slug, server = time_agent
    _ask_time(model, server, "Europe/Berlin")
    with api(live_stack, api_key_for(f"mcp-{server}")) as client:
        session_id = create_session(client, slug)

        events = _turn(live_stack, client, session_id, 1, "What time is it in Berlin?")
        messages = get_messages(client, session_id)

    assert _tool_statuses(events) == ["success"], stack_logs(live_stack, "worker")()
    assert messages[-1]["role"] == "assistant"
    assert messages[-1]["content"].startswith("The time there: 20")
    assert len(model.requests) == 2


def test_a_server_killed_mid_session_is_started_again_by_the_next_call(
    live_stack, model, time_agent
):
    slug, server = time_agent
    before = _time_servers(live_stack)
    with api(live_stack, api_key_for(f"mcp-{server}")) as client:
        session_id = create_session(client, slug)
        _ask_time(model, server, "Asia/Tokyo")
        _turn(live_stack, client, session_id, 1, "What time is it in Tokyo?")
        # Kept after the call: the worker's one process for this server.
        (first,) = _time_servers(live_stack) - before

        psutil.Process(first).send_signal(signal.SIGKILL)
        deadline = time.monotonic() + 10
        while first in _time_servers(live_stack):
            assert time.monotonic() < deadline, "the killed server is still there"
            time.sleep(0.05)
        _ask_time(model, server, "America/Lima")
        started = time.monotonic()
        events = _turn(live_stack, client, session_id, 2, "And in Lima?")
        took = time.monotonic() - started

    assert _tool_statuses(events) == ["success", "success"], stack_logs(live_stack, "worker")()
    (second,) = _time_servers(live_stack) - before
    assert second != first
    # A process start, not a hang or a timeout (10 s).
    assert took < 10
    worker_log = live_stack.logs["worker"].read_text(errors="replace")
    assert f"mcp server {server} (stdio:{SERVER}) exited" in worker_log


def _admin_client(stack: Stack, username: str) -> httpx.Client:
    """A signed-in admin session on the live web process."""
    get_user_model().objects.create_superuser(username, f"{username}@example.com", "pw-e2e-1")
    client = httpx.Client(base_url=stack.http, timeout=20)
    client.get("/admin/login/")
    client.post(
        "/admin/login/?next=/admin/",
        data={
            "username": username,
            "password": "pw-e2e-1",
            "csrfmiddlewaretoken": client.cookies["csrftoken"],
        },
        headers={"Referer": f"{stack.http}/admin/login/"},
    )
    return client


def test_refresh_tools_in_the_admin_runs_in_the_live_worker(live_stack):
    name = f"time{uuid.uuid4().hex[:8]}"
    server = McpServer.objects.create(name=name, command=[SERVER], timeout_s=10)
    username = f"ops{uuid.uuid4().hex[:6]}"
    changelist = "/admin/tools/mcpserver/"
    client = _admin_client(live_stack, username)
    try:
        answer = client.post(
            changelist,
            data={
                "action": "refresh_tools",
                "_selected_action": [server.pk],
                "csrfmiddlewaretoken": client.cookies["csrftoken"],
            },
            headers={"Referer": f"{live_stack.http}{changelist}"},
            follow_redirects=True,
        )
        assert "Refresh queued for" in answer.text, answer.text[:2000]

        deadline = time.monotonic() + 45
        while McpServer.objects.get(pk=server.pk).refresh_state in ("", "queued"):
            assert time.monotonic() < deadline, stack_logs(live_stack, "worker")()
            time.sleep(0.2)
        listing = client.get(changelist).text

    finally:
        client.close()

    server.refresh_from_db()
    assert (server.refresh_state, server.last_error) == ("ok", ""), server.last_error
    assert Tool.objects.filter(name=f"{name}.get_current_time").exists()
    assert "ok 20" in listing
    done = AuditEntry.objects.get(action="mcp.refreshed", object_id=str(server.pk))
    assert done.actor == f"admin:{username}" and f"{name}.get_current_time" in done.data["added"]
