"""Refreshing an MCP server's tools in the admin takes `refresh_mcpserver`."""

import pytest
from django.test import Client
from django.urls import reverse

from tests.factories import StaffUserFactory, permissions
from tests.fakes.mcp_fixtures import free_port
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
