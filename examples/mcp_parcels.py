"""A tiny MCP server for the README's "MCP tools" example (the `mcp` SDK's MCPServer).

.venv/bin/python examples/mcp_parcels.py            # streamable HTTP on 127.0.0.1:9300/mcp
.venv/bin/python examples/mcp_parcels.py stdio      # or over stdin/stdout
"""

import sys
from typing import Annotated, Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.types import ToolAnnotations
from pydantic import Field

server = MCPServer("parcels")


@server.tool(
    description=(
        "Where a parcel is now and when it should arrive. Use when the customer asks about a "
        "delivery; do not use for returns or refunds. Returns the status and the expected date."
    ),
    annotations=ToolAnnotations(read_only_hint=True),
)
def track_parcel(
    tracking_number: Annotated[
        str, Field(description="The carrier's tracking number, e.g. JD0042")
    ],
    ctx: Context,
) -> dict[str, Any]:
    authorized = (ctx.headers or {}).get("authorization") is not None
    return {
        "tracking_number": tracking_number,
        "status": "in transit",
        "eta": "2026-12-02",
        "authorized": authorized,
    }


@server.tool(
    description=(
        "Delete every open order of the shop. Use only when an administrator asks for it; "
        "never for a single order. Returns {wiped: true}."
    ),
    annotations=ToolAnnotations(destructive_hint=True),
)
def wipe_orders(confirm: Annotated[bool, Field(description="Must be true")]) -> dict[str, Any]:
    return {"wiped": bool(confirm)}


if __name__ == "__main__":
    if sys.argv[1:] == ["stdio"]:
        server.run()
    else:
        server.run("streamable-http", host="127.0.0.1", port=9300)
