"""Handing a webhook delivery to a worker; the task is sent by name (runtime/tasks.py)."""

from typing import Any

from runtime.tasks import task_send

WEBHOOK_TASK = "approvals.tasks.webhook_send"


def webhook_enqueue(payload: dict[str, Any]) -> None:
    try:
        task_send(WEBHOOK_TASK, (payload,))
    except Exception:  # noqa: BLE001 - the broker down must not fail a decision; the queue is the truth
        import logging

        logging.getLogger(__name__).warning("approvals: could not enqueue a webhook", exc_info=True)
