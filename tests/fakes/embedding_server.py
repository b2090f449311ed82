"""A real OpenAI-compatible `/v1/embeddings` server on 127.0.0.1 whose vectors the test controls.

Semantics by construction: each word maps to a concept (a basis direction) through
`concepts`; a text's vector is the sum of its concepts' directions, so two
paraphrases that share concepts get the same vector whatever their wording, and
texts about different things are orthogonal. Words with no concept add a small
hashed component, so unrelated wording still differs a little. `vectors` pins an
exact vector to an exact text.

    with FakeEmbeddingServer(dimension=16, concepts={"colour": 0, "color": 0}) as server:
        EmbeddingEndpoint.objects.create(name="fake", base_url=server.base_url, model="fake", dimension=16)
"""

import hashlib
import json
import math
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class _Handler(BaseHTTPRequestHandler):
    server: "_Server"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass

    def do_POST(self) -> None:  # noqa: N802 - stdlib naming
        fake = self.server.fake
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        fake.record(self.path, dict(self.headers), body)
        if not self.path.endswith("/embeddings") or fake.fail_status:
            status = fake.fail_status or 404
            self._send(status, {"error": {"message": "no", "type": "invalid_request_error"}})
            return
        texts = body.get("input")
        texts = [texts] if isinstance(texts, str) else list(texts or [])
        data = [
            {"object": "embedding", "index": i, "embedding": fake.vector(t)}
            for i, t in enumerate(texts)
        ]
        self._send(200, {"object": "list", "data": data, "model": body.get("model", "")})

    def _send(self, status: int, payload: Any) -> None:
        raw = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    fake: "FakeEmbeddingServer"


class FakeEmbeddingServer:
    def __init__(
        self,
        dimension: int = 16,
        concepts: dict[str, int] | None = None,
        noise: float = 0.15,
    ) -> None:
        self.dimension = dimension
        self.concepts = dict(concepts or {})
        self.vectors: dict[str, list[float]] = {}
        self.noise = noise
        self.fail_status = 0
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._httpd: _Server | None = None

    def record(self, path: str, headers: dict[str, str], body: Any) -> None:
        with self._lock:
            self.requests.append({"path": path, "headers": headers, "body": body})

    @property
    def texts_embedded(self) -> list[str]:
        out: list[str] = []
        for r in self.requests:
            texts = r["body"].get("input")
            out.extend([texts] if isinstance(texts, str) else texts or [])
        return out

    def vector(self, text: str) -> list[float]:
        if text in self.vectors:
            return self.vectors[text]
        v = [0.0] * self.dimension
        for word in re.findall(r"[^\W_]+", text.lower()):
            if word in self.concepts:
                v[self.concepts[word] % self.dimension] += 1.0
            else:
                h = hashlib.sha256(word.encode()).digest()
                v[h[0] % self.dimension] += self.noise * (1 if h[1] & 1 else -1)
        norm = math.sqrt(sum(x * x for x in v)) or 1.0
        return [x / norm for x in v]

    def start(self) -> "FakeEmbeddingServer":
        self._httpd = _Server(("127.0.0.1", 0), _Handler)
        self._httpd.fake = self
        threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="fake-embeddings",
            daemon=True,
        ).start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self) -> "FakeEmbeddingServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        assert self._httpd is not None, "server not started"
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"
