"""The engine: runs a session's steps and makes every change of its state.

This is its whole public surface; the services (and only they, among the
edges' callers) use it. Inside: `runner` (the run loop and lease), the phases
(`model_phase`, `tool_phase`) that decide, `moves` that make every state
change, and `commit` that writes a step atomically.
"""

from .approval_gate import approval_recorded
from .ask_user import open_question, user_answer
from .commit import StaleSession
from .context import summary_through
from .memory_glue import turn_memory_keep
from .moves import INTERRUPT_REASON, fork_start, run_resume, timer_fire, turn_cancel, turn_start
from .runner import RunResult, session_run
from .takeover import (
    hand_back,
    operator_finish,
    operator_reply,
    operator_tool_intent,
    operator_tool_result,
)

__all__ = [
    "INTERRUPT_REASON",
    "RunResult",
    "approval_recorded",
    "StaleSession",
    "fork_start",
    "hand_back",
    "operator_finish",
    "operator_reply",
    "operator_tool_intent",
    "operator_tool_result",
    "open_question",
    "run_resume",
    "session_run",
    "summary_through",
    "timer_fire",
    "turn_cancel",
    "turn_memory_keep",
    "turn_start",
    "user_answer",
]
