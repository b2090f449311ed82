"""A real HTTP receiver on 127.0.0.1 for run webhooks: it records each POST (body and
headers) and answers as told: a status, a redirect, or not at all for a while (a hang)."""

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest


@dataclass
class Received:
    body: bytes
    headers: dict[str, str]


@dataclass
class Receiver:
    url: str
    received: list[Received] = field(default_factory=list)
    status: int = 204
    location: str = ""
    hang_s: float = 0.0


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    box: list[Receiver] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            me = box[0]
            body = self.rfile.read(int(self.headers["Content-Length"]))
            me.received.append(Received(body, {k.lower(): v for k, v in self.headers.items()}))
            if me.hang_s:
                time.sleep(me.hang_s)
            self.send_response(me.status)
            if me.location:
                self.send_header("Location", me.location)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    box.append(Receiver(url=f"http://127.0.0.1:{server.server_port}/hooks/runs"))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield box[0]
    server.shutdown()
    server.server_close()
