"""Forking a session from a checkpoint."""

import logging
from collections.abc import Sequence
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from audit.models import AuditAction
from engine import (
    fork_start,
    summary_through,
)
from record import dispatch
from record.errors import NotFound
from record.models import (
    Checkpoint,
    Message,
    MessageStatus,
    Session,
)
from sessions.services.grants import session_role_check
from sessions.services.trail import session_audit

logger = logging.getLogger(__name__)


def session_fork(
    *,
    session: Session,
    step: int,
    owner: User | None = None,
    actor: str = "",
    role: str | None = None,
    key_roles: Sequence[str] | None = None,
    key_prefix: str = "",
) -> Session:
    """A new session from checkpoint `step` of this one; the original is untouched.

    0. Its role is `role`, or else the source's. A key's fork (`key_roles` given) must
       hold that role (`session_role_check`); an operator's (None) keeps the source's.
    1. Copy the history the checkpoint covers (messages up to its `message_seq`),
       dropping a trailing tool request whose results lie beyond it.
    2. If the copy ends with the user or a tool result, the model decides next
       (-> tool_loop) and a worker is woken; otherwise it waits for the user.
    3. The next model step compares the environment recorded at the fork with
       today's and tells the model what changed.
    4. The audit trail records the fork on the source session, in the same transaction.
    """
    fork_role = role or session.role
    if key_roles is not None:
        session_role_check(role=fork_role, key_roles=key_roles)
    checkpoint = Checkpoint.objects.filter(session=session, step=step).first()
    if checkpoint is None:
        raise NotFound(
            f"session {session.pk} has no checkpoint {step}", details={"field": "checkpoint"}
        )
    recorded_env = (
        Checkpoint.objects.filter(session=session, step__lte=step, context__has_key="env")
        .order_by("-step")
        .values_list("context", flat=True)
        .first()
    )
    with transaction.atomic():
        history = list(
            Message.objects.filter(
                session=session, status=MessageStatus.FINAL, seq__lte=checkpoint.message_seq
            ).order_by("seq")
        )
        while history and history[-1].role == "assistant" and history[-1].tool_calls:
            history.pop()
        fork = Session.objects.create(
            agent=session.agent,
            owner=owner or session.owner,
            role=fork_role,
            metadata={**session.metadata, "forked_from": str(session.pk), "forked_at_step": step},
            forked_from=session,
            forked_at_step=step,
            turn=checkpoint.turn,
            message_seq=len(history),
            resume_check=True,
            workflow_version_id=session.workflow_version_id,
            workflow_state=_fork_workflow_state(session, step)
            if session.workflow_version_id is not None
            else None,
        )
        # What a summary in the copy replaced stays archived there; what only a
        # later summary of the source replaced is live again in the fork.
        through = max((summary_through(m) or 0 for m in history), default=0)
        Message.objects.bulk_create(
            [
                Message(
                    session=fork,
                    seq=i,
                    turn=m.turn,
                    role=m.role,
                    status=MessageStatus.FINAL,
                    content=m.content,
                    tool_calls=m.tool_calls,
                    tool_call_id=m.tool_call_id,
                    name=m.name,
                    data=m.data,
                    token_count=m.token_count,
                    token_counter=m.token_counter,
                    archived_at=(m.archived_at or timezone.now()) if i <= through else None,
                )
                for i, m in enumerate(history, start=1)
            ]
        )
        decide = session.workflow_version_id is not None or (
            bool(history) and history[-1].role in ("user", "tool", "system")
        )
        fork_start(
            fork=fork,
            source=session,
            at_step=step,
            message_seq=len(history),
            env=recorded_env["env"] if recorded_env else None,
            decide=decide,
            actor=actor,
        )
        session_audit(
            action=AuditAction.SESSION_FORK,
            session=session,
            actor=actor,
            key_prefix=key_prefix,
            data={"fork": str(fork.pk), "at_step": step, "role": fork_role, "decides": decide},
        )
        if decide:
            dispatch.run_enqueue_on_commit(fork.pk, fork.value)
    return fork


def _fork_workflow_state(session: Session, step: int) -> dict[str, Any]:
    """A workflow run forked from a node's checkpoint starts where that step left it: the
    outputs so far and the nodes active then, each of which runs again from its start (its
    calls belong to the source run; the fork's own get keys of their own). A map keeps
    the items it had finished."""
    # The run's state as of that step: the latest node step's at or before it.
    context = (
        Checkpoint.objects.filter(session=session, step__lte=step, context__has_key="workflow")
        .order_by("-step")
        .values_list("context", flat=True)
        .first()
    ) or {}
    state = dict(context.get("workflow") or {})
    if not state:  # before its first node finished: from the start, with the same input
        first = Message.objects.filter(session=session, seq=1).first()
        data = first.data if first is not None and isinstance(first.data, dict) else {}
        return {"values": {"input": data.get("input")}}
    progress: dict[str, Any] = {}
    for node_id, kept in (state.get("progress") or {}).items():
        if isinstance(kept, dict) and "items" in kept:
            progress[node_id] = {
                "items": kept["items"],
                "results": kept.get("results") or {},
                "items_progress": {},
            }
    state["progress"] = progress
    for key in ("error", "result", "deadline_at"):
        state.pop(key, None)
    return state
