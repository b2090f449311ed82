"""The front door: what the edges call. Each function is keyword-only, runs in one short
transaction and leaves the long work (model and tool calls) to a worker, woken after
commit. One module per concern:

- grants: what a key may do with a session (its role, its value)
- messages: opening sessions and posting messages (queue, double texting)
- runs: interrupt, cancel, run what is pending, resume a stopped run, turn memory
- approvals: decisions on approvals and reviews (four eyes, deadlines), expiry
- operator: human takeover (answer, run a tool by hand, hand back)
- fork: a new session from a checkpoint
- idempotency: requests that may be retried (an owner's Idempotency-Key)
- sweep: the sweeper's work (leases, pacing, credits, timers, deadlines, pruning)
- agent_versions: an agent's configuration versions, one per change

This module only names them, so the edges import `sessions.services` as before.
"""

from sessions.services.agent_versions import agent_version_record
from sessions.services.approvals import (
    approval_change,
    approval_decide,
    approvals_expire_due,
    review_answer,
)
from sessions.services.fork import session_fork
from sessions.services.grants import session_role_check, session_value_check
from sessions.services.idempotency import (
    DERIVED_PREFIX as IDEMPOTENCY_DERIVED_PREFIX,
)
from sessions.services.idempotency import (
    HEADER as IDEMPOTENCY_HEADER,
)
from sessions.services.idempotency import (
    KeyedRequest,
    KeyedResponse,
    request_fingerprint,
    request_key_find,
    request_key_parse,
    request_key_save,
    request_keyed_respond,
    request_keys_prune,
)
from sessions.services.messages import (
    PostedMessage,
    extra_context_check,
    message_post,
    message_post_for_owner,
    session_create,
    session_get,
)
from sessions.services.operator import (
    WAITING,
    session_force_finish,
    session_hand_back,
    session_operator_reply,
    session_operator_tool_run,
)
from sessions.services.runs import (
    memory_turn_keep,
    session_cancel,
    session_resume,
    session_run_pending,
    summary_ahead_run,
    turn_interrupt,
)
from sessions.services.sweep import (
    budget_holds_reconcile,
    checkpoints_prune,
    credits_reconcile,
    ephemeral_sessions_prune,
    questions_expire_due,
    sessions_sweep,
    sessions_sweep_scheduled,
    steps_pace,
    timers_fire_due,
)

__all__ = [
    "agent_version_record",
    "IDEMPOTENCY_DERIVED_PREFIX",
    "IDEMPOTENCY_HEADER",
    "KeyedRequest",
    "KeyedResponse",
    "request_fingerprint",
    "request_key_find",
    "request_key_parse",
    "request_key_save",
    "request_keyed_respond",
    "request_keys_prune",
    "ephemeral_sessions_prune",
    "WAITING",
    "PostedMessage",
    "approval_change",
    "approval_decide",
    "approvals_expire_due",
    "budget_holds_reconcile",
    "checkpoints_prune",
    "credits_reconcile",
    "extra_context_check",
    "memory_turn_keep",
    "summary_ahead_run",
    "message_post",
    "message_post_for_owner",
    "questions_expire_due",
    "review_answer",
    "session_cancel",
    "session_create",
    "session_force_finish",
    "session_fork",
    "session_get",
    "session_hand_back",
    "session_operator_reply",
    "session_operator_tool_run",
    "session_resume",
    "session_role_check",
    "session_run_pending",
    "session_value_check",
    "sessions_sweep",
    "sessions_sweep_scheduled",
    "steps_pace",
    "timers_fire_due",
    "turn_interrupt",
]
