"""A Celery worker's own `/metrics`: what the workers count, readable on a host without a web process.

The web's `/metrics` serves the samples of the processes that share its
PROMETHEUS_MULTIPROC_DIR, i.e. of its own machine. Workers on hosts of their own
(README "Deployment") would keep their model, step and tool figures where no scraper
can read them; with `WORKER_METRICS_PORT` set each worker process serves them itself.

Every worker process of a host binds the same port (SO_REUSEPORT) and the kernel
hands each scrape to one of them: with PROMETHEUS_MULTIPROC_DIR (one directory per
host) any of them answers with the host's sum, and the endpoint stays up while one
of them lives. Without it each process answers with its own samples (run one worker
process per host then). Only the processes' own metrics: the gauges read from
PostgreSQL and Redis are the web's to serve (they describe the whole deployment,
and would be counted once per host otherwise). The same scrapers as the web's
`/metrics` are let in (observability/access.py); anyone else gets a 404.
"""

import json
import logging
import os
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client import multiprocess as prometheus_multiprocess
from prometheus_client.registry import REGISTRY

from .access import scraper_allowed

logger = logging.getLogger(__name__)

NOT_FOUND = json.dumps(
    {"error": {"code": "not_found", "message": "Not found.", "details": {}}}
).encode()


def process_registry() -> CollectorRegistry:
    """The host's processes' samples (multiprocess mode), or this process's own."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        prometheus_multiprocess.MultiProcessCollector(registry)
        return registry
    return REGISTRY


class _Handler(BaseHTTPRequestHandler):
    server: "_Server"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        return  # a scrape every few seconds is not worth a log line

    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        path = self.path.split("?", 1)[0]
        permitted = scraper_allowed(
            authorization=self.headers.get("Authorization", ""), address=self.client_address[0]
        )
        if path != "/metrics" or not permitted:
            self._send(404, "application/json", NOT_FOUND)
            return
        self._send(200, CONTENT_TYPE_LATEST, generate_latest(self.server.registry))

    def _send(self, status: int, content_type: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], registry: CollectorRegistry) -> None:
        self.registry = registry
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        # Every worker process of the host on one port; the kernel spreads the scrapes.
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        super().server_bind()


def metrics_endpoint_start(*, bind: str, port: int) -> ThreadingHTTPServer | None:
    """Serve GET /metrics on bind:port from a daemon thread; None (and a warning) if the port is taken."""
    try:
        server = _Server((bind, port), process_registry())
    except OSError as exc:
        logger.warning("worker metrics endpoint not started on %s:%s: %s", bind, port, exc)
        return None
    threading.Thread(
        target=server.serve_forever, name="worker-metrics", daemon=True, kwargs={"poll_interval": 1}
    ).start()
    logger.info("worker metrics endpoint on %s:%s", bind, server.server_address[1])
    return server
