"""The admin: MCP servers refreshed by a worker (the admin only queues it), and each tool's
description checked."""

import base64
import json
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import redis
from django.contrib.auth import get_user_model
from django.contrib.messages import get_messages
from django.urls import reverse

from audit.models import AuditEntry
from tests.stack import broker_queue_lists
from tools import services
from tools.models import McpServer, Tool
from tools.tasks import mcp_server_refresh_run

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def operator(client):  # type: ignore[no-untyped-def]
    user = get_user_model().objects.create_superuser("operator", "op@example.com", "pw-not-used")
    client.force_login(user)
    return user


def _refresh(client, *servers: McpServer) -> list[tuple[str, str]]:  # type: ignore[no-untyped-def]
    response = client.post(
        reverse("admin:tools_mcpserver_changelist"),
        {"action": "refresh_tools", "_selected_action": [s.pk for s in servers]},
        follow=True,
    )
    assert response.status_code == 200
    return [(m.level_tag, m.message) for m in get_messages(response.wsgi_request)]


def _queued() -> list[tuple[str, list[Any]]]:
    """(task name, args) of each message waiting in this run's worker queue (the real broker)."""
    broker, lists = broker_queue_lists()
    found = []
    for name in lists:
        for raw in broker.lrange(name, 0, -1):
            message = json.loads(raw)
            args = json.loads(base64.b64decode(message["body"]))[0]
            found.append((message["headers"]["task"], args))
    return found


class _Hits(BaseHTTPRequestHandler):
    seen: list[str] = []

    def do_POST(self) -> None:  # noqa: N802 - the handler's name
        self.seen.append(self.path)
        self.send_response(500)
        self.end_headers()

    do_GET = do_POST  # noqa: N815

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def hits() -> Iterator[tuple[str, list[str]]]:
    """(url, paths requested) of an HTTP server that counts every request."""
    _Hits.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hits)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/mcp", _Hits.seen
    finally:
        server.shutdown()
        server.server_close()


def test_the_refresh_action_only_queues_a_task_no_process_or_request_in_the_web_process(
    client, operator, hits, tmp_path, unique
):
    url, seen = hits
    started = tmp_path / "started"
    http = McpServer.objects.create(name=f"h{unique}", url=url, timeout_s=3)
    # A stdio server whose process leaves a mark as it starts.
    script = "import pathlib, sys; pathlib.Path(sys.argv[1]).touch()"
    stdio = McpServer.objects.create(
        name=f"s{unique}", command=[sys.executable, "-c", script, str(started)], timeout_s=3
    )

    shown = _refresh(client, http, stdio)

    assert shown == [
        (
            "info",
            f"Refresh queued for {http.name}, {stdio.name}: a worker lists the tools; reload "
            "this page for the outcome (column 'last refresh').",
        )
    ]
    time.sleep(0.5)  # what the web process might have started in the background
    assert seen == [] and not started.exists()
    assert sorted(_queued()) == sorted(
        ("tools.tasks.mcp_server_refresh", [s.pk, "admin:operator"]) for s in (http, stdio)
    )
    for server in (http, stdio):
        server.refresh_from_db()
        assert server.refresh_state == "queued" and server.refresh_queued_at is not None
    listing = client.get(reverse("admin:tools_mcpserver_changelist")).content.decode()
    assert listing.count("queued 20") == 2


def test_the_worker_side_refresh_stores_the_tools_and_the_row_shows_the_outcome(
    client, operator, mcp_server, unique
):
    server = McpServer.objects.create(name=f"p{unique}", url=mcp_server.url, roles=["support"])
    name = server.name
    _refresh(client, server)

    # What the worker runs: the task's body (tests/e2e/test_mcp_stdio_e2e.py runs it in one).
    mcp_server_refresh_run(server.pk, "admin:operator")

    server.refresh_from_db()
    assert (server.refresh_state, server.last_error) == ("ok", "")
    assert {f"{name}.track_parcel", f"{name}.wipe_orders"} <= set(
        Tool.objects.filter(mcp_server=server).values_list("name", flat=True)
    )
    listing = client.get(reverse("admin:tools_mcpserver_changelist")).content.decode()
    assert "ok 20" in listing and mcp_server.url in listing
    done = AuditEntry.objects.get(action="mcp.refreshed", object_id=str(server.pk))
    assert done.actor == "admin:operator" and done.data["outcome"] == "ok"
    assert f"{name}.track_parcel" in done.data["added"] and done.before == {"tools": []}


def test_a_failed_refresh_shows_the_error_class_never_the_answers_text(client, operator, unique):
    """A refresh pointed at any URL: the row and the page name the error, not what came back."""

    class Answer(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            body = b"internal-only-body: db password hunter2"
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    answering = ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=answering.serve_forever, daemon=True).start()
    try:
        server = McpServer.objects.create(
            name=f"a{unique}", url=f"http://127.0.0.1:{answering.server_address[1]}/", timeout_s=3
        )
        _refresh(client, server)
        mcp_server_refresh_run(server.pk, "admin:operator")
    finally:
        answering.shutdown()
        answering.server_close()

    server.refresh_from_db()
    assert server.refresh_state == "failed"
    assert server.last_error == "MCPError (code -32700)"
    listing = client.get(reverse("admin:tools_mcpserver_changelist")).content.decode()
    page = client.get(reverse("admin:tools_mcpserver_change", args=[server.pk])).content.decode()
    assert "MCPError (code -32700)" in listing
    assert "hunter2" not in listing + page
    done = AuditEntry.objects.get(action="mcp.refreshed", object_id=str(server.pk))
    assert done.data == {"outcome": "failed", "error": "MCPError (code -32700)"}


def test_a_refresh_the_broker_does_not_take_is_an_error_on_the_page_and_the_row(
    client, operator, monkeypatch, unique
):
    def broker_down(*args: Any, **kwargs: Any) -> None:
        raise redis.ConnectionError("Error 111 connecting to 127.0.0.1:6379")

    monkeypatch.setattr(services, "task_send", broker_down)
    server = McpServer.objects.create(name=f"b{unique}", url="http://127.0.0.1:9/mcp")

    assert _refresh(client, server) == [
        ("error", f"mcp {server.name}: refresh not queued: ConnectionError (is the broker up?)")
    ]
    server.refresh_from_db()
    assert (server.refresh_state, server.last_error) == ("failed", "not queued: ConnectionError")


def _tool_post(**overrides: str) -> dict[str, str]:
    data = {
        "name": "clock",
        "description": "What time is it?",
        "result_description": "",
        "parameters": '{"type": "object", "properties": {"tz": {"type": "string"}}}',
        "kind": "python",
        "handler": "builtin.current_time",
        "method": "POST",
        "headers": "{}",
        "timeout_s": "10",
        "approval_timeout_s": "1800",
        "approval_on_timeout": "reject",
        "credit_cost": "0",
        "idempotent": "on",
        "enabled": "on",
    }
    data.update(overrides)
    return data


def test_saving_a_tool_warns_about_its_description_and_the_page_shows_the_check(client, operator):
    response = client.post(reverse("admin:tools_tool_add"), _tool_post(), follow=True)
    assert response.status_code == 200
    shown = [m.message for m in get_messages(response.wsgi_request)]
    assert "tool clock: parameters without a description: tz" in shown
    tool = Tool.objects.get(name="clock")
    page = client.get(reverse("admin:tools_tool_change", args=[tool.pk])).content.decode()
    assert "description does not say when to use it" in page


def test_strict_mode_refuses_the_form(client, operator, settings):
    settings.TOOL_DESCRIPTIONS_STRICT = True
    response = client.post(reverse("admin:tools_tool_add"), _tool_post())
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors["description"]
    assert "parameters without a description: tz (TOOL_DESCRIPTIONS_STRICT is on)" in errors
    assert not Tool.objects.filter(name="clock").exists()


def test_the_form_checks_a_tools_retry_policy_and_an_empty_one_is_the_default(client, operator):
    response = client.post(reverse("admin:tools_tool_add"), _tool_post(retry='{"attempts": 0}'))
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors["retry"]
    assert "'attempts' must be a whole number from 1 to 10" in errors[0]
    assert not Tool.objects.filter(name="clock").exists()

    client.post(reverse("admin:tools_tool_add"), _tool_post(retry='{"attempts": 3, "on": ["429"]}'))
    assert Tool.objects.get(name="clock").retry == {"attempts": 3, "on": ["429"]}
    tool = Tool.objects.get(name="clock")
    client.post(reverse("admin:tools_tool_change", args=[tool.pk]), _tool_post(retry=""))
    assert Tool.objects.get(name="clock").retry == {}
