"""The approvals webhook: signed, delivered to a real HTTP server, retried on failure."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pytest

from approvals.webhook import (
    SIGNATURE_HEADER,
    WebhookFailed,
    signature,
    signature_valid,
    webhook_post,
)

received: list[tuple[bytes, str]] = []


class Receiver(BaseHTTPRequestHandler):
    status = 200

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        received.append((body, self.headers.get(SIGNATURE_HEADER, "")))
        self.send_response(type(self).status)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def receiver():  # type: ignore[no-untyped-def]
    received.clear()
    server = HTTPServer(("127.0.0.1", 0), Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/hook"
    server.shutdown()
    Receiver.status = 200


def test_a_delivery_is_signed_with_hmac(receiver, settings):
    settings.APPROVAL_WEBHOOK_URL = receiver
    settings.APPROVAL_WEBHOOK_SECRET = "s3cret"
    assert webhook_post({"type": "approval.requested", "data": {"id": "x"}}) == 200
    [(body, header)] = received
    assert json.loads(body)["type"] == "approval.requested"
    assert signature_valid("s3cret", body, header)
    assert not signature_valid("other", body, header)
    assert not signature_valid("s3cret", body + b" ", header)
    old = signature("s3cret", body, int(time.time()) - 3600)
    assert not signature_valid("s3cret", body, old)  # too old: no replays


def test_a_refused_delivery_raises_so_the_task_retries(receiver, settings):
    settings.APPROVAL_WEBHOOK_URL = receiver
    Receiver.status = 503
    with pytest.raises(WebhookFailed):
        webhook_post({"type": "approval.resolved", "data": {}})
    settings.APPROVAL_WEBHOOK_URL = "http://127.0.0.1:9/unreachable"
    with pytest.raises(WebhookFailed):
        webhook_post({"type": "approval.resolved", "data": {}})


def test_the_task_retries_with_backoff():
    from approvals.tasks import webhook_send

    assert webhook_send.autoretry_for == (WebhookFailed,)
    assert webhook_send.retry_backoff is True and webhook_send.retry_jitter is True


def test_a_frame_for_a_refused_address_is_not_sent_nor_retried(receiver, settings):
    from approvals.tasks import webhook_send

    settings.APPROVAL_WEBHOOK_URL = receiver
    settings.EGRESS_ALLOW = []
    assert webhook_send({"type": "approval.requested", "data": {}}) == 0
    assert received == []
