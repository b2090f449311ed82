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


ASK_USER = "ask_user"
ASK_USER_HANDLER = "builtin.ask_user"
ASK_USER_PARAMETERS: dict[str, object] = {
    "type": "object",
    "properties": {
        "question": {"type": "string", "minLength": 1, "maxLength": 2000},
        "options": {"type": "array", "items": {"type": "string"}, "maxItems": 20},
        "deadline_s": {"type": "integer", "minimum": 1, "maximum": 30 * 24 * 3600},
        "default_answer": {"type": "string", "maxLength": 2000},
    },
    "required": ["question"],
    "additionalProperties": False,
}


@tool_handler(ASK_USER_HANDLER)
def ask_user(**arguments: object) -> dict[str, object]:
    """Runs only for a second question in one step: the engine asks the user the first one."""
    return {
        "ok": False,
        "error": "one question at a time: ask this after the user answered the first",
    }


# Long-term memory: the engine runs these (engine/gates/memory.py), since they need
# the session's owner and id; the handlers below answer only a call made outside a session.
REMEMBER = "remember"
REMEMBER_HANDLER = "builtin.remember"
REMEMBER_PARAMETERS: dict[str, object] = {
    "type": "object",
    "properties": {
        "content": {"type": "string", "minLength": 1, "maxLength": 2000},
        "tag": {"type": "string", "minLength": 1, "maxLength": 40},
        # What the memory is about ("favourite colour"): a new value for a subject the owner
        # already has updates that memory (the old value kept as its history).
        "subject": {"type": "string", "minLength": 1, "maxLength": 200},
    },
    "required": ["content"],
    "additionalProperties": False,
}
RECALL = "recall"
RECALL_HANDLER = "builtin.recall"
RECALL_PARAMETERS: dict[str, object] = {
    "type": "object",
    "properties": {"query": {"type": "string", "minLength": 1, "maxLength": 1000}},
    "required": ["query"],
    "additionalProperties": False,
}
MEMORY_HANDLERS = frozenset({REMEMBER_HANDLER, RECALL_HANDLER})


@tool_handler(REMEMBER_HANDLER)
def remember(**arguments: object) -> dict[str, object]:
    return {"ok": False, "error": "remember works only inside a session"}


@tool_handler(RECALL_HANDLER)
def recall(**arguments: object) -> dict[str, object]:
    return {"ok": False, "error": "recall works only inside a session"}


WORKFLOW_REVIEW_HANDLER = "builtin.workflow_review"


@tool_handler(WORKFLOW_REVIEW_HANDLER)
def workflow_review(**arguments: object) -> dict[str, object]:
    """A workflow's human node, once a person approved it (or its deadline's policy did):
    the decision and what was shown, as the approver left it (they may edit it)."""
    return {"approved": True, **arguments}
