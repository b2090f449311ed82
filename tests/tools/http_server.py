"""A scripted business API on 127.0.0.1 for HTTP tool tests: records every request, answers from a script.

    with ScriptedApi() as api:
        api.script(Drop(), Answer(200, {"ok": True}))
        ... call a tool whose url is api.url("/things") ...
        assert api.requests[0].headers["idempotency-key"] == "k"

When the script is empty, requests get `default` (200 with {"ok": true} unless set).
"""

import contextlib
import json
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit


@dataclass
class Answer:
    status: int = 200
    body: Any = field(default_factory=lambda: {"ok": True})
    delay_s: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Drop:
    """Read the request, then close the connection without a byte of answer."""


@dataclass
class Seen:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]  # lower-cased names
    body: Any
    raw_query: str = ""


class _Handler(BaseHTTPRequestHandler):
    server: "_Server"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        url = urlsplit(self.path)
        seen = Seen(
            method=self.command,
            path=url.path,
            query={k: v[0] for k, v in parse_qs(url.query).items()},
            headers={k.lower(): v for k, v in self.headers.items()},
            body=json.loads(raw) if raw else None,
            raw_query=url.query,
        )
        action = self.server.api.next(seen)
        if isinstance(action, Drop):
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
            return
        if action.delay_s:
            time.sleep(action.delay_s)
        data = json.dumps(action.body).encode()
        try:
            self.send_response(action.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in action.headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)
        except OSError:  # the client gave up (a timeout)
            pass

    do_GET = do_POST = do_PUT = do_DELETE = _serve  # noqa: N815 - stdlib naming


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    api: "ScriptedApi"


class ScriptedApi:
    def __init__(self, default: Answer | None = None) -> None:
        self.default = default or Answer()
        self._script: deque[Answer | Drop] = deque()
        self._seen: list[Seen] = []
        self._lock = threading.Lock()
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.api = self
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def __enter__(self) -> "ScriptedApi":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def url(self, path: str = "/") -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}{path}"

    def script(self, *actions: Answer | Drop) -> None:
        with self._lock:
            self._script.extend(actions)

    def next(self, seen: Seen) -> Answer | Drop:
        with self._lock:
            self._seen.append(seen)
            return self._script.popleft() if self._script else self.default

    @property
    def requests(self) -> list[Seen]:
        with self._lock:
            return list(self._seen)


class Firehose:
    """An API on 127.0.0.1 that answers every request with `size` bytes of a JSON body,
    written 64 KB at a time, and counts what the kernel took before the client hung up.

    `sent` is an upper bound of what the client can have read: what it read plus what
    sat in the two sockets' buffers when it closed.
    """

    CHUNK = 64 * 1024

    def __init__(self, size: int) -> None:
        self.size = size
        self.sent = 0
        self.finished = threading.Event()
        self.completed = False
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> "Firehose":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._listener.close()

    def url(self, path: str = "/") -> str:
        return f"http://127.0.0.1:{self._listener.getsockname()[1]}{path}"

    def _serve(self) -> None:
        conn, _ = self._listener.accept()
        # A small send buffer: what the kernel took is close to what was sent.
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
        with conn:
            request = b""
            while b"\r\n\r\n" not in request:
                request += conn.recv(65536)
            head = b'{"rows":"'
            tail = b'"}'
            conn.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {self.size}\r\n\r\n".encode()
                + head
            )
            left = self.size - len(head) - len(tail)
            chunk = b"x" * self.CHUNK
            try:
                while left > 0:
                    piece = chunk[: min(left, self.CHUNK)]
                    conn.sendall(piece)
                    self.sent += len(piece)
                    left -= len(piece)
                conn.sendall(tail)
                self.completed = True
            except OSError:  # the client closed the connection
                pass
            finally:
                self.finished.set()
