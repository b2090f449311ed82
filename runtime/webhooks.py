"""Signed webhook deliveries, one JSON POST each (the approvals', the cost notices' and
the run webhooks').

`<header>: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">` with the hook's secret;
the receiver recomputes it and checks that t is recent, so a captured request cannot be
replayed later. The URL passes the egress policy (runtime/egress.py): a refused one is
never sent to, and not retried either.
"""

import hashlib
import hmac
import json
import logging
import time
from typing import Any

import httpx

from . import egress
from .egress import EgressRefused

logger = logging.getLogger(__name__)
__all__ = ["EgressRefused", "WebhookFailed", "signature", "signature_valid", "signed_post"]


class WebhookFailed(Exception):
    """The receiver did not take the delivery (network error or a non-2xx answer)."""


def signature(secret: str, body: bytes, timestamp: int) -> str:
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"t={timestamp},v1={mac.hexdigest()}"


def signature_valid(secret: str, body: bytes, header: str, max_age_s: float = 300) -> bool:
    try:
        parts = dict(p.split("=", 1) for p in header.split(","))
        timestamp = int(parts["t"])
    except (KeyError, ValueError):
        return False
    if abs(time.time() - timestamp) > max_age_s:
        return False
    return hmac.compare_digest(signature(secret, body, timestamp), header)


def signed_post(
    *,
    url: str,
    payload: dict[str, Any],
    secret: str,
    header: str,
    timeout_s: float,
    headers: dict[str, str] | None = None,
) -> int:
    """POST one payload (signed when there is a secret, with any further `headers`); raise
    WebhookFailed when it should be retried, EgressRefused (logged here) when the policy
    refuses its address."""
    body = json.dumps(payload, separators=(",", ":"), default=str).encode()
    headers = {"Content-Type": "application/json", **(headers or {})}
    if secret:
        headers[header] = signature(secret, body, int(time.time()))
    try:
        with egress.client(timeout=timeout_s) as client:
            response = client.post(url, content=body, headers=headers)
    except httpx.HTTPError as exc:
        raise WebhookFailed(type(exc).__name__) from exc
    except EgressRefused as exc:
        logger.warning("webhook not sent: %s", exc)
        raise
    if not 200 <= response.status_code < 300:
        raise WebhookFailed(f"HTTP {response.status_code}")
    return response.status_code
