"""MCP servers through the official `mcp` SDK: list their tools, call one.

Over streamable HTTP each call opens its own client session on the running
loop, which in a worker is the shared io loop (runtime/io_loop.py): one
handshake round trip on loopback, and nothing outlives the call. A stdio
server's process costs seconds to start, so its calls share one session per
process (tools/mcp_stdio.py); listing tools starts a process of its own.

Errors come out as two types the executor turns into tool results:
`McpToolError` (the server answered: the tool failed or refused the call) and
`McpUnreachable` (no answer: down, refused, cut, a process that would not start).
"""

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from observability.redaction import scrub

from . import mcp_stdio
from .result_limits import cut_form, http_read_limit

if TYPE_CHECKING:
    from mcp import Client

    from .models import McpServer

# A stdio server starts a process (a Python one imports the SDK: ~2-3 s on this machine).
DISCOVERY_TIMEOUT_S = 30.0
IDEMPOTENCY_META_KEY = "idempotency_key"
MESSAGE_MAX_CHARS = 2000


@dataclass(frozen=True)
class McpEndpoint:
    """How to reach one server; read from its row before the database connection is given back."""

    name: str
    url: str = ""
    command: tuple[str, ...] = ()
    headers: dict[str, Any] = field(default_factory=dict)
    env: dict[str, Any] = field(default_factory=dict)
    timeout_s: float = 10.0

    @classmethod
    def from_model(cls, server: "McpServer") -> "McpEndpoint":
        return cls(
            name=server.name,
            url=server.url,
            command=tuple(server.command or ()),
            headers=dict(server.headers or {}),
            env=dict(server.env or {}),
            timeout_s=server.timeout_s,
        )

    @property
    def where(self) -> str:
        """For log lines and messages: the URL, or the command's program."""
        return self.url or f"stdio:{self.command[0] if self.command else '?'}"


@dataclass(frozen=True)
class ListedTool:
    """One tool as the server lists it."""

    name: str
    description: str
    input_schema: dict[str, Any]
    output_schema: dict[str, Any] | None = None
    read_only: bool | None = None
    idempotent: bool | None = None


class McpError(Exception):
    """An MCP failure. Its text quotes the server or its transport, so it is scrubbed once,
    here, for everything that stores or shows it: the tool result, the server's
    `last_error`, the admin's message, a config load's report."""

    def __init__(self, message: str, summary: str = "") -> None:
        # Cut after scrubbing: a cut first could leave half an address the scrubber misses.
        super().__init__(scrub(message)[:MESSAGE_MAX_CHARS])
        # What an operator's page may show: the error's class and code, never the remote
        # answer's text (a server, or any URL a refresh was pointed at, writes that).
        self.summary = summary or type(self).__name__


class McpUnreachable(McpError):
    """No usable answer from the server: down, refused, cut, or a process that did not start."""


class McpToolError(McpError):
    """The server answered with an error: the tool failed, or refused the call."""


def _leaf(exc: BaseException) -> BaseException:
    """The first real error inside the SDK's task-group exception groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _summary(exc: BaseException) -> str:
    """The failure without its text: the error's class, and its JSON-RPC code if it has one
    (the SDK turns an HTTP status into one: -32601 a 404, -32603 another 4xx/5xx)."""
    leaf = _leaf(exc)
    if isinstance(leaf, mcp_stdio.StdioRefused):
        return f"{type(leaf).__name__}: {leaf}"  # our own words, no server's
    code = getattr(leaf, "code", None)
    return f"{type(leaf).__name__} (code {code})" if isinstance(code, int) else type(leaf).__name__


def _describe(exc: BaseException) -> str:
    leaf = _leaf(exc)
    text = " ".join(str(leaf).split())
    return f"{type(leaf).__name__}: {text}" if text else type(leaf).__name__


@asynccontextmanager
async def _connected(endpoint: McpEndpoint, shared: bool) -> AsyncIterator["Client"]:
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    from .env_access import header_values

    if endpoint.url:
        # Slack over the call's own limit: the executor's timeout decides, and says "timeout".
        http = httpx2.AsyncClient(
            headers=header_values(endpoint.headers),
            timeout=httpx2.Timeout(endpoint.timeout_s + 5),
        )
        async with http:
            transport = streamable_http_client(endpoint.url, http_client=http)
            async with Client(transport, cache=None) as client:
                yield client
    elif shared:
        async with mcp_stdio.shared_session(endpoint, answered=(McpToolError,)) as client:
            yield client
    else:
        async with mcp_stdio.connected(endpoint) as client:
            yield client


async def _guarded(endpoint: McpEndpoint, work: Any, shared: bool = False) -> Any:
    """Run `work(client)` on a session; translate what goes wrong into our two errors.

    `shared`: a stdio server's session kept for later calls (tools/mcp_stdio.py);
    otherwise a session of its own.
    """
    from mcp import MCPError
    from mcp_types import CONNECTION_CLOSED

    from .env_access import HeaderEnvRefused

    try:
        async with _connected(endpoint, shared) as client:
            try:
                return await work(client)
            except MCPError as exc:
                if exc.code == CONNECTION_CLOSED:
                    # The server went away (a stdio process that died): no answer, not a refusal.
                    raise McpUnreachable(
                        f"{endpoint.where}: the connection closed", _summary(exc)
                    ) from exc
                raise McpToolError(
                    str(exc) or "the server refused the call", _summary(exc)
                ) from exc
    except (McpToolError, McpUnreachable, HeaderEnvRefused):
        raise
    except BaseExceptionGroup as group:
        leaf = _leaf(group)
        if isinstance(
            leaf, McpToolError | McpUnreachable | HeaderEnvRefused | asyncio.CancelledError
        ):
            raise leaf from None
        raise McpUnreachable(f"{endpoint.where}: {_describe(group)}", _summary(group)) from group
    except Exception as exc:  # noqa: BLE001 - any transport failure is "no answer"
        raise McpUnreachable(f"{endpoint.where}: {_describe(exc)}", _summary(exc)) from exc


async def list_tools(endpoint: McpEndpoint) -> list[ListedTool]:
    """Every tool the server lists, page by page."""

    async def work(client: "Client") -> list[ListedTool]:
        found: list[ListedTool] = []
        cursor: str | None = None
        for _ in range(100):
            page = await client.list_tools(cursor=cursor)
            for tool in page.tools:
                hints = tool.annotations
                found.append(
                    ListedTool(
                        name=tool.name,
                        description=" ".join((tool.description or "").split()),
                        input_schema=dict(tool.input_schema or {}),
                        output_schema=dict(tool.output_schema) if tool.output_schema else None,
                        read_only=hints.read_only_hint if hints else None,
                        idempotent=hints.idempotent_hint if hints else None,
                    )
                )
            cursor = page.next_cursor
            if not cursor:
                break
        return found

    result: list[ListedTool] = await asyncio.wait_for(
        _guarded(endpoint, work), timeout=max(endpoint.timeout_s, DISCOVERY_TIMEOUT_S)
    )
    return result


def _result_output(result: Any) -> dict[str, Any]:
    """A CallToolResult as the dict the executor stores and renders."""
    parts: list[str] = []
    for block in result.content or ():
        text = getattr(block, "text", None)
        parts.append(text if isinstance(text, str) else f"[{block.type} content omitted]")
    text = "\n".join(parts)
    if result.is_error:
        raise McpToolError(text.strip() or "the tool reported an error")
    if isinstance(result.structured_content, dict):
        return dict(result.structured_content)  # cut by the executor, if too large
    if len(text) > http_read_limit():
        # Not parsed: what is kept of it is the start of its text, whatever it holds.
        encoded = text.encode("utf-8", errors="surrogatepass")
        if len(encoded) > http_read_limit():
            return cut_form(
                encoded,
                original_bytes=len(encoded),
                sha256=hashlib.sha256(encoded).hexdigest(),
            )
    try:
        parsed = json.loads(text)
    except ValueError:
        return {"result": text}
    return parsed if isinstance(parsed, dict) else {"result": parsed}


async def call_tool(
    endpoint: McpEndpoint, tool: str, arguments: dict[str, Any], idempotency_key: str
) -> dict[str, Any]:
    """Call one tool; the logical call's idempotency key travels in the request's `_meta`.

    The caller bounds the time (the tool's timeout). Cancelling this closes an HTTP
    session; a stdio server's shared session stays unless the server seems hung.
    """

    async def work(client: "Client") -> dict[str, Any]:
        from mcp.types import RequestParamsMeta

        meta = cast(RequestParamsMeta, {IDEMPOTENCY_META_KEY: idempotency_key})
        result = await client.call_tool(tool, arguments, meta=meta)
        return _result_output(result)

    output: dict[str, Any] = await _guarded(endpoint, work, shared=True)
    return output
