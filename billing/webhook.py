"""The cost notices' webhook: one POST per notice, signed the way the approvals webhook
signs (approvals/webhook.py): `X-Cost-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256
of "<t>.<body>">` with COST_NOTICE_WEBHOOK_SECRET; the receiver recomputes it and checks
that t is recent."""

import json
import time
from typing import Any

import httpx
from django.conf import settings

from approvals.webhook import WebhookFailed, signature

SIGNATURE_HEADER = "X-Cost-Signature"

__all__ = ["SIGNATURE_HEADER", "WebhookFailed", "notice_post"]


def notice_post(payload: dict[str, Any]) -> int:
    """POST one notice; raise WebhookFailed when it should be retried."""
    body = json.dumps(payload, separators=(",", ":"), default=str).encode()
    headers = {"Content-Type": "application/json"}
    if settings.COST_NOTICE_WEBHOOK_SECRET:
        headers[SIGNATURE_HEADER] = signature(
            settings.COST_NOTICE_WEBHOOK_SECRET, body, int(time.time())
        )
    try:
        response = httpx.post(
            settings.COST_NOTICE_WEBHOOK_URL,
            content=body,
            headers=headers,
            timeout=settings.COST_NOTICE_WEBHOOK_TIMEOUT_S,
        )
    except httpx.HTTPError as exc:
        raise WebhookFailed(type(exc).__name__) from exc
    if not 200 <= response.status_code < 300:
        raise WebhookFailed(f"HTTP {response.status_code}")
    return response.status_code
