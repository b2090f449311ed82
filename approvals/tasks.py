"""Celery entry points of approvals: take data, call one function."""

from typing import Any

from celery import shared_task
from django.conf import settings

from .webhook import EgressRefused, WebhookFailed, webhook_post


@shared_task(
    name="approvals.tasks.webhook_send",
    bind=True,
    ignore_result=True,
    autoretry_for=(WebhookFailed,),
    retry_backoff=True,
    retry_backoff_max=600,
    retry_jitter=True,
    max_retries=None,
)
def webhook_send(self: Any, payload: dict[str, Any]) -> int:
    # max_retries comes from the settings at call time, so tests can shorten it.
    self.max_retries = settings.APPROVAL_WEBHOOK_RETRIES
    try:
        return webhook_post(payload)
    except EgressRefused:
        return 0  # logged by signed_post; the address is refused on every attempt
