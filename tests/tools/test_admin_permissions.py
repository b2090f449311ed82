"""Refreshing an MCP server's tools in the admin takes `refresh_mcpserver`; resetting a tool's
circuit breaker takes `reset_breaker_tool` (as a model endpoint's takes its own); a stdio
server's command and environment are a superuser's, and only an allow-listed executable."""

import sys

import pytest
from django.conf import settings
from django.test import Client
from django.urls import reverse

from audit.models import AuditEntry
from tests.factories import StaffUserFactory, ToolFactory, UserFactory, permissions
from tests.fakes.mcp_fixtures import free_port
from tools.execution import tool_breaker
from tools.models import McpServer

pytestmark = pytest.mark.django_db
CHANGELIST = reverse("admin:tools_mcpserver_changelist")


def test_refreshing_takes_its_own_permission() -> None:
    staff = StaffUserFactory(
        username="ops", perms=["tools.view_mcpserver", "tools.change_mcpserver"]
    )
    server = McpServer.objects.create(
        name="down", url=f"http://127.0.0.1:{free_port()}/mcp", timeout_s=2
    )
    client = Client()
    client.force_login(staff)
    refresh = {"action": "refresh_tools", "_selected_action": [server.pk], "index": 0}
    assert "refresh_tools" not in client.get(CHANGELIST).content.decode()
    client.post(CHANGELIST, refresh)
    server.refresh_from_db()
    assert server.refresh_state == ""

    staff.user_permissions.add(*permissions("tools.refresh_mcpserver"))
    assert "refresh_tools" in client.get(CHANGELIST).content.decode()
    client.post(CHANGELIST, refresh)
    server.refresh_from_db()
    assert server.refresh_state == "queued"
    (queued,) = AuditEntry.objects.filter(action="mcp.refresh_queued")
    assert (queued.actor, queued.user_id, queued.object_id) == (
        "admin:ops",
        staff.pk,
        str(server.pk),
    )
    assert (queued.before, queued.after) == ({"refresh_state": ""}, {"refresh_state": "queued"})


# Who may say what runs on the host ------------------------------------------------------------

ALLOWED = sys.executable  # on MCP_STDIO_COMMANDS in the tests (tests/pytest_env.py)


def _server_post(**overrides: str) -> dict[str, str]:
    data = {
        "name": "tz",
        "enabled": "on",
        "url": "",
        "headers": "{}",
        "command": "",
        "env": "{}",
        "timeout_s": "10",
        "roles": "",
        "tool_roles": "{}",
    }
    data.update(overrides)
    return data


def _stdio_server() -> McpServer:
    """A stdio server as a deployer's apply_config stores it."""
    server: McpServer = McpServer.objects.create(
        name="tz", command=[ALLOWED, "server.py"], env={"TZ": "UTC"}
    )
    return server


@pytest.mark.parametrize(
    "perms",
    [
        ["tools.view_mcpserver", "tools.add_mcpserver", "tools.change_mcpserver"],
        ["tools.view_mcpserver", "tools.change_mcpserver"],
    ],
    ids=["add-and-change", "change-only"],
)
def test_staff_who_are_not_superusers_cannot_change_a_stdio_command(perms: list[str]) -> None:
    staff = StaffUserFactory(username="ops", perms=perms)
    server = _stdio_server()
    client = Client()
    client.force_login(staff)
    change = reverse("admin:tools_mcpserver_change", args=[server.pk])

    page = client.get(change).content.decode()
    # Shown, read-only: no input for them.
    assert "server.py" in page and 'name="command"' not in page and 'name="env"' not in page
    response = client.post(
        change,
        _server_post(command="/bin/sh,-c,env > /tmp/x", env='{"LD_PRELOAD": "/tmp/x.so"}'),
    )

    assert response.status_code == 302
    server.refresh_from_db()
    assert (server.command, server.env) == ([ALLOWED, "server.py"], {"TZ": "UTC"})
    assert not AuditEntry.objects.filter(action="admin.change").exists()  # nothing changed


def test_staff_who_are_not_superusers_cannot_create_a_stdio_server() -> None:
    staff = StaffUserFactory(
        username="ops",
        perms=["tools.view_mcpserver", "tools.add_mcpserver", "tools.change_mcpserver"],
    )
    client = Client()
    client.force_login(staff)

    response = client.post(
        reverse("admin:tools_mcpserver_add"), _server_post(command="/bin/sh,-c,id")
    )

    assert response.status_code == 200
    assert "command" not in response.context["adminform"].form.fields
    assert response.context["adminform"].form.errors["url"] == [
        "give either a url (streamable HTTP) or a command (stdio)"
    ]
    assert not McpServer.objects.exists()


def test_a_superuser_may_start_only_an_allow_listed_executable() -> None:
    admin_user = UserFactory(username="root", is_staff=True, is_superuser=True)
    client = Client()
    client.force_login(admin_user)
    add = reverse("admin:tools_mcpserver_add")

    refused = client.post(add, _server_post(command="/bin/sh,-c,id"))
    errors = refused.context["adminform"].form.errors
    assert errors["command"] == [
        "/bin/sh is not allowed: a stdio server may start only an executable on "
        f"MCP_STDIO_COMMANDS ({', '.join(settings.MCP_STDIO_COMMANDS)})"
    ]
    secret = client.post(
        add, _server_post(command=f"{ALLOWED},server.py", env='{"KEY": {"env": "SECRET_KEY"}}')
    )
    assert secret.context["adminform"].form.errors["env"] == [
        "KEY reads SECRET_KEY, but tool headers may read only names starting with TOOL_SECRET_"
    ]
    assert not McpServer.objects.exists()

    created = client.post(add, _server_post(command=f"{ALLOWED},server.py", env='{"TZ": "UTC"}'))
    assert created.status_code == 302
    server = McpServer.objects.get(name="tz")
    assert (server.command, server.env) == ([ALLOWED, "server.py"], {"TZ": "UTC"})
    (added,) = AuditEntry.objects.filter(action="admin.add")
    assert added.actor == "admin:root"
    assert (added.after["command"], added.after["env"]) == ([ALLOWED, "server.py"], {"TZ": "UTC"})

    client.post(
        reverse("admin:tools_mcpserver_change", args=[server.pk]),
        _server_post(command=f"{ALLOWED},other.py", env='{"TZ": "UTC"}'),
    )
    (changed,) = AuditEntry.objects.filter(action="admin.change")
    assert changed.before == {"command": [ALLOWED, "server.py"]}
    assert changed.after == {"command": [ALLOWED, "other.py"]}


def test_resetting_a_tools_breaker_takes_its_own_permission() -> None:
    # "change tool" is not enough: a reset sends calls to a tool its breaker judged down.
    staff = StaffUserFactory(username="ops", perms=["tools.view_tool", "tools.change_tool"])
    tool = ToolFactory(name="flaky")
    breaker = tool_breaker()
    for _ in range(breaker.threshold):
        breaker.record_failure(tool.name)
    client = Client()
    client.force_login(staff)
    url = reverse("admin:tools_tool_changelist")
    reset = {"action": "reset_breaker", "_selected_action": [tool.pk], "index": 0}
    try:
        assert "reset_breaker" not in client.get(url).content.decode()
        client.post(url, reset)
        assert breaker.state(tool.name).state == "open"

        staff.user_permissions.add(*permissions("tools.reset_breaker_tool"))
        assert "Reset the circuit breaker" in client.get(url).content.decode()
        client.post(url, reset)
        assert breaker.state(tool.name).state == "closed"
    finally:
        breaker.reset(tool.name)
