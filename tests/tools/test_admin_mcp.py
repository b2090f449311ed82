"""The admin: MCP servers refreshed with a diff, and each tool's description checked."""

import pytest
from django.contrib.auth import get_user_model
from django.contrib.messages import get_messages
from django.urls import reverse

from tests.fakes.mcp_fixtures import free_port
from tools.models import McpServer, Tool

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


def test_the_refresh_action_shows_what_changed(client, operator, mcp_server, unique):
    server = McpServer.objects.create(name=f"p{unique}", url=mcp_server.url, roles=["support"])
    name = server.name

    shown = _refresh(client, server)

    (success,) = [m for level, m in shown if level == "success"]
    assert f"mcp {name}: added {name}.track_parcel" in success
    assert f"mcp {name}: added {name}.wipe_orders" in success
    # The server's description problems: one message with their count and where to see them.
    assert [m for level, m in shown if level == "warning"] == [
        f"mcp server {name}: 8 description warnings on 3 tools (the server's own text); "
        f"see them on each tool's page (Tools, search '{name}.')"
    ]
    Tool.objects.filter(name=f"{name}.fail").update(description="Old text.")
    Tool.objects.filter(name=f"{name}.slow").delete()
    again = [m for level, m in _refresh(client, server) if level == "success"]
    assert again == [
        f"mcp {name}: added {name}.slow; mcp {name}: changed {name}.fail (description)"
    ]
    listing = client.get(reverse("admin:tools_mcpserver_changelist")).content.decode()
    assert name in listing and mcp_server.url in listing


def test_a_server_that_is_down_is_an_error_message(client, operator, unique):
    server = McpServer.objects.create(
        name=f"d{unique}", url=f"http://127.0.0.1:{free_port()}/mcp", timeout_s=3
    )
    ((level, message),) = _refresh(client, server)
    assert level == "error" and message.startswith(f"mcp {server.name}: cannot list its tools: ")


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
