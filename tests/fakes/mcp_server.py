"""An MCP server for the tests (the SDK's MCPServer, formerly FastMCP), over streamable HTTP or stdio.

    python tests/fakes/mcp_server.py http PORT [--log FILE] [--variant FILE]
    python tests/fakes/mcp_server.py stdio [--log FILE] [--variant FILE]

`--log` appends one JSON line per tool call (name, arguments, the Authorization
header, the idempotency key from `_meta`, and the server's process id), so a
test can tell a call never reached the server, and which process answered it. `--variant FILE` holding "2" lists a changed set of tools
(for refresh diffs; a stdio server reads it at each start).
"""

import argparse
import json
import os
from pathlib import Path
from typing import Annotated, Any

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import Field


def build(log: str | None, variant: str) -> MCPServer:
    server = MCPServer("parcels")

    def record(name: str, arguments: dict[str, Any], ctx: Context) -> dict[str, Any]:
        meta = ctx.request_context.meta or {}
        headers = dict(ctx.headers or {})
        seen = {
            "tool": name,
            "arguments": arguments,
            "authorization": headers.get("authorization"),
            "idempotency_key": meta.get("idempotency_key"),
        }
        if log:
            with Path(log).open("a") as out:
                out.write(json.dumps({**seen, "pid": os.getpid()}) + "\n")
        return seen

    track = (
        "Where a parcel is now and when it should arrive. Use when the customer asks about a "
        "delivery; do not use for returns."
    )
    if variant == "2":
        track += " Works for every carrier."

    @server.tool(description=track, annotations=ToolAnnotations(read_only_hint=True))
    def track_parcel(
        tracking_number: Annotated[str, Field(description="The carrier's tracking number")],
        ctx: Context,
    ) -> dict[str, Any]:
        seen = record("track_parcel", {"tracking_number": tracking_number}, ctx)
        return {"status": "in transit", "eta": "2026-12-02", **seen}

    if variant != "2":

        @server.tool(
            description="Delete every order.", annotations=ToolAnnotations(destructive_hint=True)
        )
        def wipe_orders(confirm: bool, ctx: Context) -> dict[str, Any]:
            return record("wipe_orders", {"confirm": confirm}, ctx)
    else:

        @server.tool(description="The estimated arrival date of a parcel.")
        def eta(tracking_number: str) -> str:
            return "2026-12-02"

    @server.tool(
        description="Sleeps. Use when a test needs a slow tool.",
        annotations=ToolAnnotations(read_only_hint=True),
    )
    async def slow(seconds: float, ctx: Context) -> str:
        record("slow", {"seconds": seconds}, ctx)
        await anyio.sleep(seconds)
        return "done"

    @server.tool(description="Always fails, as a carrier API that is down would.")
    def fail(ctx: Context) -> str:
        record("fail", {}, ctx)
        raise ToolError("the carrier API is down")

    return server


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("transport", choices=["http", "stdio"])
    parser.add_argument("port", nargs="?", type=int, default=0)
    parser.add_argument("--log")
    parser.add_argument("--variant")
    args = parser.parse_args()
    variant = ""
    if args.variant and Path(args.variant).exists():
        variant = Path(args.variant).read_text().strip()
    server = build(args.log, variant)
    if args.transport == "stdio":
        server.run()
    else:
        server.run("streamable-http", host="127.0.0.1", port=args.port)


if __name__ == "__main__":
    main()
