"""Built-in Python tool handlers available to every deployment."""

from datetime import UTC, datetime

from .registry import tool_handler


@tool_handler("builtin.current_time")
def current_time() -> dict[str, str]:
    return {"now": datetime.now(UTC).isoformat()}


@tool_handler("builtin.schedule_followup")
def schedule_followup(after_seconds: int, note: str) -> dict[str, object]:
    """Ask to be woken later; the engine puts the session in waiting_timer until then."""
    if after_seconds < 1 or after_seconds > 30 * 24 * 3600:
        return {"ok": False, "error": "after_seconds must be between 1 and 2592000 (30 days)"}
    return {"ok": True, "after_seconds": after_seconds, "note": note, "scheduled": True}
