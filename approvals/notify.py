"""Telling approvers: the approvers' websocket group and the optional webhook, after commit.

Best effort, like every notification here: the approvals themselves live in
PostgreSQL, and `GET /api/v1/approvals/?status=pending` is always the truth.
"""

import logging
from datetime import UTC, datetime
from typing import Any, TypedDict

from channels.layers import get_channel_layer
from django.conf import settings
from django.db import transaction

from runtime import io_loop

from .models import Approval

logger = logging.getLogger(__name__)

APPROVERS_GROUP = "approvals"


class ApprovalFrame(TypedDict):
    type: str  # approval.requested | approval.resolved
    ts: str
    data: dict[str, Any]


def approval_data(approval: Approval) -> dict[str, Any]:
    """The listing's shape (DESIGN: GET /api/v1/approvals/), plus who may decide it."""
    return {
        "id": str(approval.pk),
        "session": str(approval.session_id),
        "kind": approval.kind,
        "tool": approval.tool_name,
        "arguments": approval.arguments,
        "edited_arguments": approval.edited_arguments,
        "risk_level": approval.risk_level,
        "reason": approval.reason,
        "status": approval.status,
        "group": approval.group,
        "requested_at": approval.requested_at.isoformat().replace("+00:00", "Z"),
        "deadline": approval.deadline.isoformat().replace("+00:00", "Z"),
    }


def make_frame(type_: str, approval: Approval, **extra: Any) -> ApprovalFrame:
    return {
        "type": type_,
        "ts": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
        "data": {**approval_data(approval), **extra},
    }


async def _send(frames: list[ApprovalFrame]) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        for frame in frames:
            await layer.group_send(APPROVERS_GROUP, {"type": "approval.frame", "frame": frame})
    except Exception:  # noqa: BLE001 - a lost notification must never fail a decision
        logger.warning("approvals: publish of %d frame(s) failed", len(frames), exc_info=True)


def _deliver(frames: list[ApprovalFrame]) -> None:
    io_loop.submit(_send(frames))
    if settings.APPROVAL_WEBHOOK_URL:
        from .dispatch import webhook_enqueue

        for frame in frames:
            webhook_enqueue(dict(frame))


def announce_on_commit(items: list[tuple[str, Approval]], **extra: Any) -> None:
    frames = [make_frame(type_, approval, **extra) for type_, approval in items]
    transaction.on_commit(lambda: _deliver(frames))
