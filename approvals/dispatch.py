"""Handing a webhook delivery to a worker; the task is looked up by name."""

from typing import Any

from celery import current_app

WEBHOOK_TASK = "approvals.tasks.webhook_send"


def webhook_enqueue(payload: dict[str, Any]) -> None:
    try:
        current_app.tasks[WEBHOOK_TASK].delay(payload)
    except Exception:  # noqa: BLE001 - the broker down must not fail a decision; the queue is the truth
        import logging

        logging.getLogger(__name__).warning("approvals: could not enqueue a webhook", exc_info=True)
