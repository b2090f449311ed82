"""MCP tools against a real MCP server started on 127.0.0.1 (streamable HTTP) or as a stdio
process: discovery, refresh diffs, calls with secrets and idempotency keys, role gating,
failures as clear tool results, and a turn on the real engine calling one.

`transaction=True`: the calls run on the shared io loop's thread, and the engine test's
tools on helper threads with their own connections.
"""

import time
from typing import Any

import pytest
from django.test import override_settings

from engine.runner import loop as runner
from record.models import Event, Message, Session, ToolCall
from runtime import io_loop
from sessions.services import message_post
from tests.fakes.mcp_fixtures import free_port
from tests.fakes.model_servers import Call, FakeModelServer, Reply
from tests.tools.http_server import ScriptedApi
from tools.execution import FAILURE_MARKER, ToolInvocation, execute_one, tools_for_agent
from tools.mcp import MESSAGE_MAX_CHARS, McpEndpoint, McpToolError, McpUnreachable, list_tools
from tools.models import McpServer, Tool
from tools.services import mcp_server_refresh

pytestmark = pytest.mark.django_db(transaction=True)


def _server(name: str, **fields: Any) -> McpServer:
    fields.setdefault("roles", ["support"])
    fields.setdefault("tool_roles", {"wipe_orders": ["admin"]})
    fields.setdefault("timeout_s", 10.0)
    server: McpServer = McpServer.objects.create(name=name, **fields)
    return server


def _call(name: str, arguments: dict[str, Any], role: str = "support", key: str = "key-1") -> Any:
    tools = tools_for_agent([name])
    return io_loop.run(execute_one(ToolInvocation("call_1", name, arguments, key), tools, role), 60)


# discovery and refresh ------------------------------------------------------------------------


def test_refresh_stores_the_listed_tools_with_their_schemas_and_roles(mcp_server, unique):
    server = _server(f"p{unique}", url=mcp_server.url)

    diff = mcp_server_refresh(server=server)

    name = server.name
    assert sorted(diff.added) == sorted(
        f"{name}.{t}" for t in ("fail", "slow", "track_parcel", "wipe_orders")
    )
    assert diff.removed == [] and diff.changed == {}
    track = Tool.objects.get(name=f"{name}.track_parcel")
    assert (track.kind, track.mcp_server_id, track.mcp_tool) == ("mcp", server.pk, "track_parcel")
    assert (
        track.parameters["properties"]["tracking_number"]["description"]
        == "The carrier's tracking number"
    )
    assert track.parameters["required"] == ["tracking_number"]
    assert track.description.startswith("Where a parcel is now")
    # Read-only (annotated) tools may be retried; the rest count as side-effecting.
    assert (track.side_effects, track.idempotent) == (False, True)
    wipe = Tool.objects.get(name=f"{name}.wipe_orders")
    assert wipe.side_effects is True
    # Roles: the server's, unless tool_roles names the tool.
    assert (track.roles, wipe.roles) == (["support"], ["admin"])
    # MCP descriptions are checked too, as warnings naming the tool.
    assert (
        f"tool {name}.wipe_orders: description does not say when to use it (e.g. 'Use when ...')"
        in diff.warnings
    )
    assert not [w for w in diff.warnings if w.startswith(f"tool {name}.track_parcel:")]
    server.refresh_from_db()
    assert server.refreshed_at is not None and server.last_error == ""


def test_a_second_refresh_reports_added_removed_and_changed_tools(mcp_files, unique):
    """Over stdio: the server process starts for each listing and reads its variant file then."""
    server = _server(f"s{unique}", command=mcp_files.stdio_command())
    first = mcp_server_refresh(server=server)
    assert len(first.added) == 4

    mcp_files.variant.write_text("2")
    diff = mcp_server_refresh(server=server)

    name = server.name
    assert diff.added == [f"{name}.eta"]
    assert diff.removed == [f"{name}.wipe_orders"]
    assert diff.changed == {f"{name}.track_parcel": ["description"]}
    assert diff.lines()[:3] == [
        f"mcp {name}: added {name}.eta",
        f"mcp {name}: removed {name}.wipe_orders",
        f"mcp {name}: changed {name}.track_parcel (description)",
    ]
    assert not Tool.objects.filter(name=f"{name}.wipe_orders").exists()
    assert mcp_server_refresh(server=server).lines() == [f"mcp {name}: tools unchanged"]


def test_a_server_that_is_down_cannot_be_refreshed_and_says_why(unique):
    server = _server(f"d{unique}", url=f"http://127.0.0.1:{free_port()}/mcp", timeout_s=3)
    with pytest.raises(McpUnreachable) as info:
        mcp_server_refresh(server=server)
    assert "127.0.0.1" in str(info.value)
    server.refresh_from_db()
    # The row (shown in the admin) names the error's class, not what came back.
    assert (server.refresh_state, server.last_error) == ("failed", "ConnectError")
    assert server.refreshed_at is not None


def test_a_down_servers_error_is_scrubbed_where_it_is_logged_and_not_stored(unique):
    # Some hosted MCP servers carry their token in the URL; the error quotes the URL.
    token = "tok_9f8e7d6c5b4a39281706"
    url = f"http://127.0.0.1:{free_port()}/mcp?token={token}"
    server = _server(f"d{unique}", url=url, timeout_s=3)
    with pytest.raises(McpUnreachable) as info:
        mcp_server_refresh(server=server)
    server.refresh_from_db()
    assert token not in str(info.value) and token not in server.last_error
    assert "token=[redacted:key]" in str(info.value)  # the worker's log line


def test_an_mcp_error_is_scrubbed_before_it_is_cut():
    # Cut first, the address would be cut in half where the scrubber no longer sees one.
    text = "x" * (MESSAGE_MAX_CHARS - 10) + " jane.roe@example.org"
    for error in (McpToolError(text), McpUnreachable(text)):
        assert "jane" not in str(error) and len(str(error)) == MESSAGE_MAX_CHARS


# calls ------------------------------------------------------------------------------------------


def test_a_call_sends_env_secret_headers_and_the_idempotency_key_in_meta(
    mcp_server, unique, monkeypatch
):
    monkeypatch.setenv("TOOL_SECRET_PARCELS_TEST", "Bearer s3cret-parcels")
    server = _server(
        f"p{unique}",
        url=mcp_server.url,
        headers={"Authorization": {"env": "TOOL_SECRET_PARCELS_TEST"}},
    )
    mcp_server_refresh(server=server)

    outcome = _call(f"{server.name}.track_parcel", {"tracking_number": "JD0042"}, key="idem-42")

    assert outcome.status == "success", outcome.content
    assert outcome.output["status"] == "in transit"
    assert outcome.attempts == 1
    (seen,) = mcp_server.calls()
    assert seen == {
        "tool": "track_parcel",
        "arguments": {"tracking_number": "JD0042"},
        "authorization": "Bearer s3cret-parcels",
        "idempotency_key": "idem-42",
    }


def test_a_header_reading_a_forbidden_variable_is_refused_before_anything_is_sent(
    mcp_server, unique
):
    server = _server(f"p{unique}", url=mcp_server.url)
    mcp_server_refresh(server=server)
    McpServer.objects.filter(pk=server.pk).update(
        headers={"Authorization": {"env": "DATABASE_URL"}}
    )

    outcome = _call(f"{server.name}.track_parcel", {"tracking_number": "JD0042"})

    assert outcome.status == "failed"
    assert "is misconfigured" in outcome.content and "DATABASE_URL" in outcome.content
    assert mcp_server.calls() == []


def test_the_tools_own_error_is_a_clear_failed_result(mcp_server, unique):
    server = _server(f"p{unique}", url=mcp_server.url)
    mcp_server_refresh(server=server)

    outcome = _call(f"{server.name}.fail", {})

    assert outcome.status == "failed"
    assert outcome.content == (
        f"{FAILURE_MARKER} (status: failed): {server.name}.fail reported an error: Error executing tool fail: the carrier API is down"
    )


def test_a_tool_slower_than_its_timeout_is_a_timeout_result(mcp_server, unique):
    server = _server(f"p{unique}", url=mcp_server.url, timeout_s=1.0)
    mcp_server_refresh(server=server)
    started = time.monotonic()

    outcome = _call(f"{server.name}.slow", {"seconds": 5})

    assert outcome.status == "timeout"
    assert outcome.content == (
        f"{FAILURE_MARKER} (status: timeout): {server.name}.slow did not answer within 1 s,"
        " 2 times (2 s in all)."
    )
    # Read-only: one retry after the first timeout, then the result.
    assert outcome.attempts == 2
    assert time.monotonic() - started < 4.5


def test_a_server_that_went_down_is_a_clear_result_and_read_only_tools_are_retried(
    mcp_server, unique
):
    server = _server(f"p{unique}", url=mcp_server.url, timeout_s=3.0)
    mcp_server_refresh(server=server)
    McpServer.objects.filter(pk=server.pk).update(url=f"http://127.0.0.1:{free_port()}/mcp")

    outcome = _call(f"{server.name}.track_parcel", {"tracking_number": "JD0042"})

    assert outcome.status == "failed"
    assert outcome.content == (
        f"{FAILURE_MARKER} (status: failed): {server.name}.track_parcel could not be reached: "
        f"its MCP server '{server.name}' is down or not answering; continue without it or tell "
        "the user it is unavailable."
    )
    assert outcome.attempts == 2


# role gating ------------------------------------------------------------------------------------


def test_a_tool_the_role_may_not_use_is_never_offered_and_never_called(mcp_server, unique):
    server = _server(f"p{unique}", url=mcp_server.url)
    mcp_server_refresh(server=server)
    names = [f"{server.name}.track_parcel", f"{server.name}.wipe_orders"]

    assert sorted(tools_for_agent(names, role="support")) == [f"{server.name}.track_parcel"]
    assert sorted(tools_for_agent(names, role="admin")) == [f"{server.name}.wipe_orders"]
    outcome = _call(f"{server.name}.wipe_orders", {"confirm": True}, role="support")
    assert outcome.status == "rejected"
    assert mcp_server.calls() == []

    # A disabled server's tools are offered to no one.
    McpServer.objects.filter(pk=server.pk).update(enabled=False)
    assert tools_for_agent(names, role="support") == {}


# a turn on the real engine ----------------------------------------------------------------------


def test_a_turn_calls_an_mcp_tool_under_a_name_valid_for_the_wire(
    mcp_server, unique, make_agent, make_session, openai_server: FakeModelServer
):
    server = _server(f"p{unique}", url=mcp_server.url)
    mcp_server_refresh(server=server)
    track, wipe = f"{server.name}.track_parcel", f"{server.name}.wipe_orders"
    wire = f"{server.name}__track_parcel"
    session = make_session(make_agent(tools=[track, wipe]), role="support")
    openai_server.strict = False  # its second reply names the hidden tool it was not offered
    openai_server.script(
        Reply(calls=[Call(wire, {"tracking_number": "JD0042"}, id="call_1")]),
        # The model tries the tool it was not offered: refused, never sent to the server.
        Reply(calls=[Call(f"{server.name}__wipe_orders", {"confirm": True}, id="call_2")]),
        Reply(text="Your parcel JD0042 is in transit and should arrive on 2 December."),
    )
    message_post(session=session, content="Where is my parcel JD0042?")

    result = runner.session_run(session_id=session.pk)

    assert result.stopped == "idle", result
    first, second, third = openai_server.requests
    # Only the tool this role may use is offered, under a name OpenAI accepts.
    assert [t["function"]["name"] for t in first.body["tools"]] == [wire]
    # The assistant's call goes back under the wire name in the next request's history.
    assert second.messages[-2]["tool_calls"][0]["function"]["name"] == wire
    assert "in transit" in second.last_tool_result()
    assert third.last_tool_result().startswith(f"{FAILURE_MARKER} (status: rejected): unknown tool")
    # The refusal names the usable tools as the model sees them.
    assert third.last_tool_result().endswith(f"Tools you may use: {wire}.")
    calls = list(ToolCall.objects.filter(session=session).order_by("step", "position"))
    # A name never offered maps back to nothing: recorded as the model sent it, and refused.
    assert [(c.tool_name, c.status) for c in calls] == [
        (track, "success"),
        (f"{server.name}__wipe_orders", "rejected"),
    ]
    assert "wipe_orders" not in first.text()
    # The server saw the recorded call's idempotency key in the request's _meta.
    assert calls[0].output is not None
    assert calls[0].output["idempotency_key"] == calls[0].idempotency_key
    assert [c["tool"] for c in mcp_server.calls()] == ["track_parcel"]
    finished = Event.objects.filter(session=session, type="tool.finished").order_by("seq")
    assert [e.data["status"] for e in finished] == ["success", "rejected"]
    answer = Message.objects.filter(session=session, role="assistant").order_by("-seq").first()
    assert answer is not None and answer.content.startswith("Your parcel JD0042 is in transit")
    assert Session.objects.get(pk=session.pk).state == "finished"


# egress (runtime/egress.py) ---------------------------------------------------------------------


def test_listing_the_tools_of_a_server_at_a_refused_address_sends_nothing_and_says_why(unique):
    """What "Refresh tools" runs: no POST leaves for a refused address, whatever answers there."""
    with ScriptedApi() as api:
        server = _server(f"e{unique}", url=api.url("/internal/admin"), timeout_s=3)
        with override_settings(EGRESS_ALLOW=[]), pytest.raises(McpUnreachable) as info:
            io_loop.run(list_tools(McpEndpoint.from_model(server)), 60)
        assert api.requests == []
    assert "egress refused: 127.0.0.1 is a loopback address that EGRESS_ALLOW does not list" in str(
        info.value
    )


def test_an_mcp_tool_at_a_refused_address_is_a_tool_error_for_the_model(mcp_server, unique):
    server = _server(f"e{unique}", url=mcp_server.url, timeout_s=3)
    mcp_server_refresh(server=server)

    with override_settings(EGRESS_ALLOW=[]):
        outcome = _call(f"{server.name}.track_parcel", {"tracking_number": "JD0042"})

    assert (outcome.status, outcome.attempts) == ("failed", 1)
    assert outcome.output == {"ok": False, "error": "egress_refused", "host": "127.0.0.1"}
    assert "cannot be called: egress refused: 127.0.0.1 is a loopback address" in outcome.content
    assert mcp_server.calls() == []
