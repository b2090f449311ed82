"""The audit trail of what people do to sessions: one entry per action, written by the
service that carries it out, in its transaction (audit/services.py writes the row and, after
the commit, its log line)."""

from typing import Any

from audit.models import AuditAction
from audit.services import audit_record
from record.models import Session


def session_audit(
    *,
    action: AuditAction,
    session: Session,
    actor: str,
    key_prefix: str = "",
    reason: str = "",
    after: dict[str, Any] | None = None,
    data: dict[str, Any] | None = None,
) -> None:
    """An action on `session` (fork, resume, cancel, takeover), by `actor`, for its owner's
    tenant."""
    audit_record(
        action=action,
        actor=actor,
        key_prefix=key_prefix,
        object_type=Session._meta.label_lower,
        object_id=session.pk,
        object_repr=str(session.pk)[:8],
        owner_id=session.owner_id,
        after=after,
        reason=reason,
        data={"state": session.state, "turn": session.turn, "step": session.step, **(data or {})},
    )
