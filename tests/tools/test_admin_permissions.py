"""Refreshing an MCP server's tools in the admin takes `refresh_mcpserver`; resetting a tool's
circuit breaker takes `reset_breaker_tool` (as a model endpoint's takes its own)."""

import pytest
from django.test import Client
from django.urls import reverse

from tests.factories import StaffUserFactory, ToolFactory, permissions
from tests.fakes.mcp_fixtures import free_port
from tools.execution import tool_breaker
from tools.models import McpServer

pytestmark = pytest.mark.django_db
CHANGELIST = reverse("admin:tools_mcpserver_changelist")


def test_refreshing_takes_its_own_permission() -> None:
    staff = StaffUserFactory(
        username="ops", perms=["tools.view_mcpserver", "tools.change_mcpserver"]
    )
    # A server that is down: a refresh that runs records why it could not list the tools.
    server = McpServer.objects.create(
        name="down", url=f"http://127.0.0.1:{free_port()}/mcp", timeout_s=2
    )
    client = Client()
    client.force_login(staff)
    refresh = {"action": "refresh_tools", "_selected_action": [server.pk], "index": 0}
    assert "refresh_tools" not in client.get(CHANGELIST).content.decode()
    client.post(CHANGELIST, refresh)
    server.refresh_from_db()
    assert server.last_error == ""

    staff.user_permissions.add(*permissions("tools.refresh_mcpserver"))
    assert "refresh_tools" in client.get(CHANGELIST).content.decode()
    client.post(CHANGELIST, refresh)
    server.refresh_from_db()
    assert server.last_error != ""


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
