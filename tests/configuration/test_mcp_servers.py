"""`mcp_servers:` in the config file, and the tool description checks with their strict mode."""

import io
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from configuration.services import ConfigInvalid, config_apply
from record.models import Agent
from tests.fakes.mcp_fixtures import free_port
from tools.models import McpServer, Tool

pytestmark = pytest.mark.django_db(transaction=True)

GOOD = (
    "The current date and time in UTC. Use when the user asks what time or day it is; "
    "do not use it for other time zones."
)


def _document(url: str, **server: Any) -> dict[str, Any]:
    return {
        "roles": [{"name": "support"}, {"name": "admin"}],
        "models": [{"name": "main", "api": "rules"}],
        "mcp_servers": [
            {
                "name": "parcels",
                "url": url,
                "headers": {"Authorization": {"env": "TOOL_SECRET_PARCELS"}},
                "timeout_s": 5,
                "roles": ["support"],
                "tool_roles": {"wipe_orders": ["admin"]},
                **server,
            }
        ],
        "agents": [
            {
                "slug": "support",
                "model": "main",
                "tools": ["parcels.track_parcel", "parcels.wipe_orders"],
            }
        ],
    }


def test_servers_are_applied_with_their_discovered_tools_and_a_diff(mcp_server):
    report = config_apply(document=_document(mcp_server.url), strict=True)

    assert "mcp server parcels: created" in report
    assert {
        "mcp parcels: added parcels.track_parcel",
        "mcp parcels: added parcels.wipe_orders",
        "mcp parcels: added parcels.fail",
        "mcp parcels: added parcels.slow",
    } <= set(report)
    # MCP tools are checked too, but only ever warn (strict or not): once per server, counted.
    assert [line for line in report if line.startswith("warning:")] == [
        "warning: mcp server parcels: 8 description warnings on 3 tools (the server's own text); "
        "see them with apply_config -v 2 or on each tool's admin page"
    ]
    assert Agent.objects.get(slug="support").tools == [
        "parcels.track_parcel",
        "parcels.wipe_orders",
    ]
    assert Tool.objects.get(name="parcels.wipe_orders").roles == ["admin"]
    server = McpServer.objects.get(name="parcels")
    assert server.headers == {"Authorization": {"env": "TOOL_SECRET_PARCELS"}}

    # Applied again: nothing changed.
    again = config_apply(document=_document(mcp_server.url))
    assert "mcp server parcels: unchanged" in again and "mcp parcels: tools unchanged" in again


def test_the_command_lists_each_mcp_description_warning_at_verbosity_2(mcp_server, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(_document(mcp_server.url)))
    quiet, verbose = io.StringIO(), io.StringIO()

    call_command("apply_config", str(path), stdout=io.StringIO(), stderr=quiet)
    call_command("apply_config", str(path), "-v", "2", stdout=io.StringIO(), stderr=verbose)

    assert quiet.getvalue().count("warning:") == 1
    assert "8 description warnings on 3 tools" in quiet.getvalue()
    listed = [line for line in verbose.getvalue().splitlines() if "warning:" in line]
    assert len(listed) == 8
    assert (
        "warning: tool parcels.wipe_orders: description does not say when to use it (e.g. 'Use when ...')"
        in verbose.getvalue()
    )


def test_the_readme_example_server_applies_without_warnings():
    """examples/mcp_parcels.py, over stdio here (the README runs it over HTTP on port 9300)."""
    document = _document("", roles=["support"])
    del document["mcp_servers"][0]["url"], document["mcp_servers"][0]["headers"]
    script = str(Path(__file__).parents[2] / "examples" / "mcp_parcels.py")
    document["mcp_servers"][0]["command"] = [sys.executable, script, "stdio"]
    document["mcp_servers"][0]["timeout_s"] = 30

    report = config_apply(document=document, strict=True)

    assert "mcp parcels: added parcels.track_parcel" in report
    assert "mcp parcels: added parcels.wipe_orders" in report
    assert [line for line in report if line.startswith("warning:")] == []


def test_an_agent_naming_a_tool_the_server_does_not_list_is_refused(mcp_server):
    document = _document(mcp_server.url)
    document["agents"][0]["tools"] = ["parcels.track_parcl"]
    with pytest.raises(ConfigInvalid) as info:
        config_apply(document=document)
    assert info.value.errors == [
        "agents[0] (support).tools[0]: MCP server 'parcels' lists no tool 'track_parcl' "
        "(it lists: fail, slow, track_parcel, wipe_orders)"
    ]
    assert not McpServer.objects.exists() and not Agent.objects.exists()


def test_a_server_that_is_down_is_an_error_or_with_no_url_check_a_warning():
    url = f"http://127.0.0.1:{free_port()}/mcp"
    with pytest.raises(ConfigInvalid) as info:
        config_apply(document=_document(url), check_urls=True)
    assert info.value.errors[0].startswith("mcp_servers[0] (parcels): cannot list its tools: ")
    assert not McpServer.objects.exists()

    report = config_apply(document=_document(url), check_urls=False)
    assert "mcp server parcels: created" in report
    assert any(
        line.startswith("warning: mcp server parcels: cannot list its tools now") for line in report
    )


def test_server_headers_follow_the_env_rule_of_http_tools():
    document = _document(
        "http://127.0.0.1:9/mcp", headers={"Authorization": {"env": "DATABASE_URL"}}
    )
    with pytest.raises(ConfigInvalid) as info:
        config_apply(document=document)
    assert info.value.errors[0].startswith(
        "mcp_servers[0] (parcels).headers.Authorization: environment variable DATABASE_URL may not be read"
    )


def _stdio_document(command: list[str], **server: Any) -> dict[str, Any]:
    document = _document("", **server)
    del document["mcp_servers"][0]["url"], document["mcp_servers"][0]["headers"]
    document["mcp_servers"][0]["command"] = command
    return document


def test_a_stdio_server_may_start_only_an_allow_listed_executable_and_read_no_secret(settings):
    document = _stdio_document(
        ["/bin/sh", "-c", "env"], env={"TZ": "UTC", "KEY": {"env": "OPENAI_API_KEY"}}
    )
    document["mcp_servers"].append(
        {"name": "web", "url": "http://127.0.0.1:9/mcp", "env": {"TZ": "UTC"}}
    )
    with pytest.raises(ConfigInvalid) as info:
        config_apply(document=document)
    allowed = ", ".join(settings.MCP_STDIO_COMMANDS)
    assert info.value.errors[:3] == [
        "mcp_servers[0] (parcels).command: /bin/sh is not allowed: a stdio server may start "
        f"only an executable on MCP_STDIO_COMMANDS ({allowed})",
        "mcp_servers[0] (parcels).env.KEY reads OPENAI_API_KEY, but tool headers may read only "
        "names starting with TOOL_SECRET_",
        "mcp_servers[1] (web).env: only for stdio servers (a command)",
    ]
    assert not McpServer.objects.exists()

    settings.MCP_STDIO_COMMANDS = []
    with pytest.raises(ConfigInvalid) as info:
        config_apply(document=_stdio_document([sys.executable, "server.py"]))
    assert info.value.errors[0] == (
        f"mcp_servers[0] (parcels).command: {sys.executable} is not allowed: "
        "MCP_STDIO_COMMANDS is empty: no stdio server may start on this deployment"
    )


def test_a_stdio_servers_declared_environment_is_stored():
    script = str(Path(__file__).parents[2] / "examples" / "mcp_parcels.py")
    document = _stdio_document(
        [sys.executable, script, "stdio"], env={"TZ": "UTC"}, timeout_s=30, roles=["support"]
    )

    report = config_apply(document=document)

    assert "mcp parcels: added parcels.track_parcel" in report
    server = McpServer.objects.get(name="parcels")
    assert (server.env, server.refresh_state, server.last_error) == ({"TZ": "UTC"}, "ok", "")


def _with_tool(description: str, **fields: Any) -> dict[str, Any]:
    return {
        "models": [{"name": "main", "api": "rules"}],
        "tools": [
            {
                "name": "clock",
                "description": description,
                "kind": "python",
                "handler": "builtin.current_time",
                **fields,
            }
        ],
    }


def test_description_problems_are_warnings_naming_the_tool():
    report = config_apply(document=_with_tool("What time is it?"))
    assert "tool clock: created" in report
    assert [line for line in report if line.startswith("warning:")] == [
        "warning: tool clock: description is too short (4 words) to say what it does; write a full sentence",
        "warning: tool clock: description does not say when to use it (e.g. 'Use when ...')",
        "warning: tool clock: description does not say when not to use it (e.g. 'Do not use for ...')",
        "warning: tool clock: no result description: say what it returns (result_description)",
    ]
    assert not [
        line
        for line in config_apply(document=_with_tool(GOOD, result_description="{now}"))
        if line.startswith("warning:")
    ]


def test_strict_mode_turns_them_into_errors_and_applies_nothing(tmp_path, settings):
    document = _with_tool(
        GOOD, parameters={"type": "object", "properties": {"tz": {"type": "string"}}}
    )
    with pytest.raises(ConfigInvalid) as info:
        config_apply(document=document, strict=True)
    assert info.value.errors == [
        "tools[0] (clock).description: parameters without a description: tz",
        "tools[0] (clock).description: no result description: say what it returns (result_description)",
    ]
    assert not Tool.objects.exists()

    # The setting does the same; the command's --strict too, and exits non-zero.
    settings.TOOL_DESCRIPTIONS_STRICT = True
    with pytest.raises(ConfigInvalid):
        config_apply(document=document)
    settings.TOOL_DESCRIPTIONS_STRICT = False
    path = tmp_path / "config.yaml"
    import yaml

    path.write_text(yaml.safe_dump(document))
    with pytest.raises(CommandError) as failed:
        call_command("apply_config", str(path), "--strict", stdout=io.StringIO())
    assert "nothing was changed" in str(
        failed.value
    ) and "parameters without a description: tz" in str(failed.value)
    assert not Tool.objects.exists()
    err = io.StringIO()
    call_command("apply_config", str(path), stdout=io.StringIO(), stderr=err)
    assert "warning: tool clock: parameters without a description: tz" in err.getvalue()
