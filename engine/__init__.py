"""The engine: runs a session's steps and makes every change of its state.

This is its whole public surface (a contract forbids naming a module inside); its callers
are the front doors' services: sessions/services/, openai_compat/services.py and
workflows/services.py. Inside, top to bottom (docs/ARCHITECTURE.md): `runner/` (the run
loop and its lease), `phases/` (the model step, the tool step, the workflow nodes),
`run_cache.py`, `moves/` (every change of a session's state, built as a step), `gates/`
(read and judge, never move), `model/` (the request assembled, the call) and `store/`
(the one writer: a step committed atomically, importing only the record).
"""

from engine.gates.client_tools import open_client_calls
from engine.gates.handoff import handoff_barred
from engine.gates.questions import open_question
from engine.model.context import summary_through
from engine.moves.approval import approval_changed, approval_recorded
from engine.moves.ask_user import client_calls_expire, client_results, user_answer
from engine.moves.credits import pool_wake
from engine.moves.takeover import (
    hand_back,
    operator_finish,
    operator_reply,
    operator_tool_intent,
)
from engine.moves.turn import (
    INTERRUPT_REASON,
    fork_start,
    run_resume,
    timer_fire,
    turn_cancel,
    turn_start,
)
from engine.phases.after_turn import summary_ahead_make, turn_memory_keep
from engine.run_cache import agent_tool_names
from engine.runner.loop import RunResult, session_run
from engine.store.commit import StaleSession

__all__ = [
    "INTERRUPT_REASON",
    "RunResult",
    "agent_tool_names",
    "approval_changed",
    "approval_recorded",
    "client_calls_expire",
    "client_results",
    "handoff_barred",
    "StaleSession",
    "fork_start",
    "hand_back",
    "operator_finish",
    "operator_reply",
    "operator_tool_intent",
    "open_client_calls",
    "open_question",
    "pool_wake",
    "run_resume",
    "session_run",
    "summary_ahead_make",
    "summary_through",
    "timer_fire",
    "turn_cancel",
    "turn_memory_keep",
    "turn_start",
    "user_answer",
]
