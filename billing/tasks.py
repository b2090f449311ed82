"""Celery tasks of billing: the cost notices' webhook (sent after the notice's commit,
retried with backoff, never in a step's way)."""

from typing import Any

from celery import shared_task
from django.conf import settings

from .services import notice_payload, notice_webhook_record
from .webhook import EgressRefused, WebhookFailed, notice_post


@shared_task(
    name="billing.tasks.notice_webhook_send",
    bind=True,
    ignore_result=True,
    autoretry_for=(WebhookFailed,),
    retry_backoff=True,
    retry_backoff_max=600,
    retry_jitter=True,
    max_retries=None,
)
def notice_webhook_send(self: Any, notice_id: int) -> int:
    # max_retries comes from the settings at call time, so tests can shorten it.
    self.max_retries = settings.COST_NOTICE_WEBHOOK_RETRIES
    payload = notice_payload(notice_id=notice_id)
    if payload is None or not settings.COST_NOTICE_WEBHOOK_URL:
        return 0
    try:
        status = notice_post(payload)
    except WebhookFailed as exc:
        notice_webhook_record(notice_id=notice_id, status=f"failed: {exc}", sent=False)
        raise
    except EgressRefused as exc:
        # Logged by signed_post; not retried: the address is refused on every attempt.
        notice_webhook_record(notice_id=notice_id, status=f"failed: {exc}", sent=False)
        return 0
    notice_webhook_record(notice_id=notice_id, status=f"HTTP {status}", sent=True)
    return status
