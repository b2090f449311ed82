"""The test MCP server (tests/fakes/mcp_server.py) started on 127.0.0.1, and stdio commands for it."""

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

SCRIPT = str(Path(__file__).with_name("mcp_server.py"))


@dataclass
class McpTestServer:
    url: str
    log: Path
    variant: Path

    def _lines(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines() if line]

    def calls(self) -> list[dict[str, Any]]:
        """What each call sent (tool, arguments, authorization, idempotency key)."""
        return [{k: v for k, v in line.items() if k != "pid"} for line in self._lines()]

    def pids(self) -> list[int]:
        """The id of the server process that took each call."""
        return [int(line["pid"]) for line in self._lines()]

    def stdio_command(self) -> list[str]:
        return [
            sys.executable,
            SCRIPT,
            "stdio",
            "--log",
            str(self.log),
            "--variant",
            str(self.variant),
        ]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _wait_for(port: int, process: subprocess.Popen[bytes], deadline_s: float = 30.0) -> None:
    ends = time.monotonic() + deadline_s
    while time.monotonic() < ends:
        if process.poll() is not None:
            raise RuntimeError("the test MCP server exited at start")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("the test MCP server did not listen in time")


@pytest.fixture
def mcp_server(tmp_path: Path) -> Iterator[McpTestServer]:
    """A streamable HTTP MCP server of this test's own, on a free port."""
    port = free_port()
    log, variant = tmp_path / "calls.jsonl", tmp_path / "variant"
    process = subprocess.Popen(
        [sys.executable, SCRIPT, "http", str(port), "--log", str(log), "--variant", str(variant)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_for(port, process)
        yield McpTestServer(url=f"http://127.0.0.1:{port}/mcp", log=log, variant=variant)
    finally:
        process.terminate()
        process.wait(timeout=10)


@pytest.fixture
def mcp_files(tmp_path: Path) -> McpTestServer:
    """The call log and variant file for a stdio server (no process until a call starts one)."""
    return McpTestServer(url="", log=tmp_path / "calls.jsonl", variant=tmp_path / "variant")
