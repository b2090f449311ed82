"""stdio MCP servers (tools/mcp_stdio.py): one session per server and process, reused by later
and concurrent calls, started again after its process died or hung, closed on demand and
forgotten by a forked child; the server's stderr in our log.

The server is the test MCP server (tests/fakes/mcp_server.py), which logs the id of the
process that took each call.
"""

import asyncio
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from runtime import io_loop
from tests.tools.test_mcp import _call, _server
from tools import mcp_stdio, stdio_policy
from tools.execution import ToolInvocation, execute_one, tools_for_agent
from tools.mcp import McpEndpoint, McpUnreachable, call_tool
from tools.services import mcp_server_refresh

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def no_sessions_left() -> Iterator[None]:
    """Each test starts without sessions and leaves no server process behind."""
    io_loop.run(mcp_stdio.close_all(), 30)
    yield
    io_loop.run(mcp_stdio.close_all(), 30)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead too (reaped only when the loop notices); one reaped between the two
    # looks has no /proc entry any more.
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:  # ProcessLookupError or FileNotFoundError, as the kernel reports it
        return False


def _wait_gone(pid: int, within_s: float = 10.0) -> None:
    deadline = time.monotonic() + within_s
    while _alive(pid):
        assert time.monotonic() < deadline, f"server process {pid} still runs"
        time.sleep(0.05)


def _stdio_server(mcp_files: Any, unique: str, **fields: Any) -> Any:
    fields.setdefault("timeout_s", 30)
    server = _server(f"s{unique}", command=mcp_files.stdio_command(), **fields)
    mcp_server_refresh(server=server)
    return server


def test_calls_share_one_server_process_started_by_the_first(mcp_files, unique):
    server = _stdio_server(mcp_files, unique)
    # Listing the tools ran a process of its own, which has ended.
    assert mcp_files.pids() == []

    outcomes = [
        _call(f"{server.name}.track_parcel", {"tracking_number": f"X{i}"}, key=f"idem-{i}")
        for i in range(3)
    ]

    assert [o.status for o in outcomes] == ["success"] * 3, [o.content for o in outcomes]
    assert [c["idempotency_key"] for c in mcp_files.calls()] == ["idem-0", "idem-1", "idem-2"]
    (pid,) = set(mcp_files.pids())
    assert _alive(pid)  # kept for the next call


def test_concurrent_calls_from_several_threads_share_the_session(mcp_files, unique):
    server = _stdio_server(mcp_files, unique)
    name = f"{server.name}.track_parcel"
    tools = tools_for_agent([name])

    def one(i: int) -> Any:
        invocation = ToolInvocation(f"call_{i}", name, {"tracking_number": f"T{i}"}, f"k-{i}")
        return io_loop.run(execute_one(invocation, tools, "support"), 60)

    # As the worker's threads pool does: each thread hands its call to the shared io loop.
    with ThreadPoolExecutor(8) as pool:
        outcomes = list(pool.map(one, range(8)))

    assert [o.status for o in outcomes] == ["success"] * 8
    assert sorted(c["idempotency_key"] for c in mcp_files.calls()) == sorted(
        f"k-{i}" for i in range(8)
    )
    assert len(set(mcp_files.pids())) == 1


def test_a_server_killed_between_calls_is_started_again_by_the_next(mcp_files, unique, caplog):
    caplog.set_level(logging.INFO, logger="tools.mcp")
    server = _stdio_server(mcp_files, unique)
    assert _call(f"{server.name}.track_parcel", {"tracking_number": "X1"}).status == "success"
    (first,) = mcp_files.pids()

    os.kill(first, signal.SIGKILL)
    _wait_gone(first)
    deadline = time.monotonic() + 5
    while "exited; its next call starts it again" not in caplog.text:
        assert time.monotonic() < deadline, caplog.text
        time.sleep(0.05)

    # Side effects: no retry, so this one call has to find a live server.
    outcome = _call(f"{server.name}.wipe_orders", {"confirm": True}, role="admin")

    assert (outcome.status, outcome.attempts) == ("success", 1), outcome.content
    second = mcp_files.pids()[-1]
    assert second != first and _alive(second)


def test_a_server_killed_during_a_call_is_unreachable_at_once_and_the_next_call_works(
    mcp_files, unique
):
    endpoint = McpEndpoint(name=f"s{unique}", command=tuple(mcp_files.stdio_command()))
    slow = io_loop.submit(call_tool(endpoint, "slow", {"seconds": 60}, "k-slow"))
    deadline = time.monotonic() + 30
    while not mcp_files.pids():
        assert time.monotonic() < deadline and not slow.done()
        time.sleep(0.05)
    (pid,) = mcp_files.pids()

    os.kill(pid, signal.SIGKILL)

    # No answer is "down" (not the tool's own error), and it comes now, not after 60 s.
    with pytest.raises(McpUnreachable):
        slow.result(10)
    output = io_loop.run(call_tool(endpoint, "track_parcel", {"tracking_number": "X2"}, "k"), 30)
    assert output["status"] == "in transit"
    assert mcp_files.pids()[-1] != pid


def test_a_server_silent_for_a_whole_timeout_is_started_again(mcp_files, unique):
    endpoint = McpEndpoint(name=f"s{unique}", command=tuple(mcp_files.stdio_command()), timeout_s=2)
    # Started, and so warm, before the call that hangs.
    io_loop.run(call_tool(endpoint, "track_parcel", {"tracking_number": "X1"}, "k1"), 30)
    (first,) = mcp_files.pids()

    with pytest.raises(TimeoutError):
        io_loop.run(
            asyncio.wait_for(call_tool(endpoint, "slow", {"seconds": 60}, "k2"), timeout=2), 30
        )
    io_loop.run(call_tool(endpoint, "track_parcel", {"tracking_number": "X3"}, "k3"), 30)

    assert mcp_files.pids()[-1] != first
    _wait_gone(first)


def test_closing_ends_the_server_process(mcp_files, unique):
    server = _stdio_server(mcp_files, unique)
    assert _call(f"{server.name}.track_parcel", {"tracking_number": "X1"}).status == "success"
    (pid,) = mcp_files.pids()

    io_loop.run(mcp_stdio.close_all(), 30)

    _wait_gone(pid)


def test_a_forked_child_does_not_inherit_the_parents_sessions(mcp_files, unique):
    server = _stdio_server(mcp_files, unique)
    assert _call(f"{server.name}.track_parcel", {"tracking_number": "X1"}).status == "success"
    assert mcp_stdio._pools

    child = os.fork()
    if child == 0:  # pragma: no cover - the child only reports
        os._exit(0 if not mcp_stdio._pools else 1)
    _, status = os.waitpid(child, 0)

    assert os.waitstatus_to_exitcode(status) == 0
    (pid,) = mcp_files.pids()
    assert _alive(pid)  # still the parent's


def test_a_servers_stderr_goes_to_the_log(unique, caplog):
    caplog.set_level(logging.INFO, logger="tools.mcp")
    complaint = f"cannot start: TIME_API_KEY is not set ({unique})"
    script = f"import sys; print({complaint!r}, file=sys.stderr); sys.exit(2)"
    endpoint = McpEndpoint(name=f"broken{unique}", command=(sys.executable, "-c", script))

    with pytest.raises(McpUnreachable):
        io_loop.run(call_tool(endpoint, "anything", {}, "k"), 30)

    deadline = time.monotonic() + 5
    while complaint not in caplog.text:
        assert time.monotonic() < deadline, caplog.text
        time.sleep(0.05)
    (record,) = [r for r in caplog.records if complaint in r.getMessage()]
    assert (record.name, record.getMessage()) == (
        "tools.mcp",
        f"mcp server broken{unique}: {complaint}",
    )


def test_a_changed_command_replaces_the_servers_process(mcp_files, unique):
    endpoint = McpEndpoint(name=f"s{unique}", command=tuple(mcp_files.stdio_command()))
    io_loop.run(call_tool(endpoint, "track_parcel", {"tracking_number": "X1"}, "k1"), 30)
    (first,) = mcp_files.pids()

    # The same server, its command edited (here: one more argument).
    changed = McpEndpoint(name=endpoint.name, command=(*endpoint.command, "--variant", "none"))
    io_loop.run(call_tool(changed, "track_parcel", {"tracking_number": "X2"}, "k2"), 30)
    io_loop.run(call_tool(changed, "track_parcel", {"tracking_number": "X3"}, "k3"), 30)

    _, second, third = mcp_files.pids()
    assert second != first and third == second
    _wait_gone(first)


# What the process may be and what it sees ------------------------------------------------------

PLATFORM_SECRETS = {
    "SECRET_KEY": "django-secret-planted",
    "DATABASE_URL": "postgresql://u:planted@db/x",
    "OPENAI_API_KEY": "sk-planted",
    "APPROVAL_WEBHOOK_SECRET": "whsec-planted",
    "TOOL_SECRET_NOT_DECLARED": "undeclared-planted",
}


def test_the_server_sees_only_the_variables_its_entry_declares(
    mcp_files, unique, tmp_path, monkeypatch
):
    for name, value in PLATFORM_SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("TOOL_SECRET_TZ_TOKEN", "declared-token")
    seen_file = tmp_path / "environment.json"
    # Writes the environment it was started with, then becomes the test MCP server.
    dump = (
        "import json, os, sys; open(sys.argv[1], 'w').write(json.dumps(dict(os.environ))); "
        "os.execv(sys.executable, [sys.executable, *sys.argv[2:]])"
    )
    server = _server(
        f"e{unique}",
        command=[sys.executable, "-c", dump, str(seen_file), *mcp_files.stdio_command()[1:]],
        env={"TZ": "UTC", "TZ_TOKEN": {"env": "TOOL_SECRET_TZ_TOKEN"}},
        timeout_s=30,
    )

    mcp_server_refresh(server=server)

    seen = json.loads(seen_file.read_text())
    assert {k: seen[k] for k in ("TZ", "TZ_TOKEN")} == {"TZ": "UTC", "TZ_TOKEN": "declared-token"}
    # The base (PATH, HOME, ...), the declared two, and what Python sets in itself at start.
    assert set(seen) - {"LC_CTYPE"} <= {*stdio_policy.BASE_ENV, "TZ", "TZ_TOKEN"}, sorted(seen)
    assert not set(PLATFORM_SECRETS.values()) & set(seen.values())


@pytest.mark.parametrize(
    ("command", "env", "refused"),
    [
        (["/bin/sh", "-c", "env"], {}, "/bin/sh is not allowed: a stdio server may start only"),
        ([sys.executable, "x.py"], {"K": {"env": "SECRET_KEY"}}, "K reads SECRET_KEY, but tool"),
    ],
    ids=["not-allow-listed", "reads-a-secret"],
)
def test_a_row_written_around_the_checks_starts_nothing(unique, command, env, refused, tmp_path):
    endpoint = McpEndpoint(name=f"r{unique}", command=tuple(command), env=env)

    with pytest.raises(McpUnreachable) as info:
        io_loop.run(call_tool(endpoint, "anything", {}, "k"), 30)

    assert info.value.summary.startswith(f"StdioRefused: mcp server r{unique}: {refused}")


def test_an_empty_allow_list_starts_no_stdio_server(mcp_files, unique, settings):
    settings.MCP_STDIO_COMMANDS = []
    endpoint = McpEndpoint(name=f"n{unique}", command=tuple(mcp_files.stdio_command()))

    with pytest.raises(McpUnreachable) as info:
        io_loop.run(call_tool(endpoint, "track_parcel", {"tracking_number": "X"}, "k"), 30)

    assert "MCP_STDIO_COMMANDS is empty: no stdio server may start" in info.value.summary
    assert mcp_files.pids() == []
