"""Reads of schedules and run webhooks: the next fire times, a delivery's payload."""

from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from django.utils import timezone

from record.models import Message, Session

from .cron import fire_times
from .models import Schedule, WebhookDelivery


def schedule_next_times(*, schedule: Schedule, count: int = 3) -> list[datetime]:
    """The schedule's next `count` due times, in its time zone: the stored next one first
    (it may have passed, if no tick fired it yet)."""
    first = schedule.next_due_at
    if first is None:
        return fire_times(schedule.cron, schedule.timezone, timezone.now(), count)
    return [
        first.astimezone(ZoneInfo(schedule.timezone)),
        *fire_times(schedule.cron, schedule.timezone, first, count - 1),
    ]


def delivery_payload(*, delivery: WebhookDelivery) -> dict[str, Any]:
    """What a run webhook POSTs: {session, turn, outcome, answer | result, usage}; built from
    the turn.finished the final commit stored, and the turn's last answer."""
    finished = delivery.finished or {}
    payload: dict[str, Any] = {
        "session": str(delivery.session_id),
        "turn": delivery.turn,
        "outcome": finished.get("outcome", ""),
        "stop_reason": finished.get("stop_reason", ""),
    }
    workflow = (
        Session.objects.filter(pk=delivery.session_id)
        .values_list("workflow_version_id", flat=True)
        .first()
    )
    if workflow is not None:
        payload["result"] = finished.get("result")
    else:
        payload["answer"] = (
            Message.objects.filter(
                session_id=delivery.session_id, turn=delivery.turn, role="assistant"
            )
            .exclude(content="")
            .order_by("-seq")
            .values_list("content", flat=True)
            .first()
        )
    payload["usage"] = finished.get("usage") or {}
    return payload
