"""Built-in Python tool handlers available to every deployment."""

from datetime import UTC, datetime

from .registry import tool_handler


@tool_handler("builtin.current_time")
def current_time() -> dict[str, str]:
    return {"now": datetime.now(UTC).isoformat()}
