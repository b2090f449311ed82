"""The cost notices' webhook: one POST per notice, signed like the approvals webhook
(runtime/webhooks.py) in `X-Cost-Signature` with COST_NOTICE_WEBHOOK_SECRET."""

from typing import Any

from django.conf import settings

from runtime.webhooks import EgressRefused, WebhookFailed, signed_post

SIGNATURE_HEADER = "X-Cost-Signature"

__all__ = ["SIGNATURE_HEADER", "EgressRefused", "WebhookFailed", "notice_post"]


def notice_post(payload: dict[str, Any]) -> int:
    """POST one notice; raise WebhookFailed when it should be retried."""
    return signed_post(
        url=settings.COST_NOTICE_WEBHOOK_URL,
        payload=payload,
        secret=settings.COST_NOTICE_WEBHOOK_SECRET,
        header=SIGNATURE_HEADER,
        timeout_s=settings.COST_NOTICE_WEBHOOK_TIMEOUT_S,
    )
