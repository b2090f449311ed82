"""runtime/webhooks.py: a signed POST whose address passes the egress policy; a refused one
is never sent, and says so in the log."""

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pytest
from django.test import override_settings

from runtime.webhooks import EgressRefused, WebhookFailed, signed_post

received: list[str] = []


class Receiver(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers["Content-Length"]))
        received.append(self.path)
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[str]:
    received.clear()
    server = HTTPServer(("127.0.0.1", 0), Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


def _post(url: str) -> int:
    return signed_post(url=url, payload={"a": 1}, secret="s", header="X-Sig", timeout_s=5)


def test_a_webhook_to_a_refused_address_is_not_sent_and_is_logged(receiver, caplog) -> None:  # type: ignore[no-untyped-def]
    with (
        override_settings(EGRESS_ALLOW=[]),
        caplog.at_level("WARNING", logger="runtime.webhooks"),
        pytest.raises(EgressRefused),
    ):
        _post(f"{receiver}/hook?key=hook-secret-123")
    assert received == []
    [line] = [r.getMessage() for r in caplog.records]
    assert line == (
        "webhook not sent: egress refused: 127.0.0.1 is a loopback address that EGRESS_ALLOW "
        "does not list"
    )
    # Not a WebhookFailed: the tasks retry those, and the policy says the same every time.
    assert not issubclass(EgressRefused, WebhookFailed)


def test_an_allowed_webhook_is_sent(receiver) -> None:  # type: ignore[no-untyped-def]
    with override_settings(EGRESS_ALLOW=["127.0.0.1"]):
        assert _post(f"{receiver}/hook") == 204
    assert received == ["/hook"]
