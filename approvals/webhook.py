"""The approvals webhook: one signed POST per frame, for teams that approve from elsewhere.

Signed with APPROVAL_WEBHOOK_SECRET in `X-Approval-Signature` (runtime/webhooks.py).
"""

from typing import Any

from django.conf import settings

from runtime.webhooks import (
    EgressRefused,
    WebhookFailed,
    signature,
    signature_valid,
    signed_post,
)

SIGNATURE_HEADER = "X-Approval-Signature"

__all__ = [
    "SIGNATURE_HEADER",
    "EgressRefused",
    "WebhookFailed",
    "signature",
    "signature_valid",
    "webhook_post",
]


def webhook_post(payload: dict[str, Any]) -> int:
    """POST one frame; raise WebhookFailed when it should be retried."""
    return signed_post(
        url=settings.APPROVAL_WEBHOOK_URL,
        payload=payload,
        secret=settings.APPROVAL_WEBHOOK_SECRET,
        header=SIGNATURE_HEADER,
        timeout_s=settings.APPROVAL_WEBHOOK_TIMEOUT_S,
    )
