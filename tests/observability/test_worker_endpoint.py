"""A worker's own /metrics: served on a shared port, to the same scrapers as the web's."""

import socket
from collections.abc import Iterator

import httpx
import pytest

from observability import metrics
from observability.worker_endpoint import metrics_endpoint_start


@pytest.fixture
def endpoint(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    server = metrics_endpoint_start(bind="127.0.0.1", port=0)
    assert server is not None
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_it_serves_this_process_s_metrics_to_an_allowed_network(endpoint: str, settings) -> None:
    settings.METRICS_TOKEN = ""
    settings.METRICS_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    metrics.TOOL_CALLS.labels("endpoint_probe", "success").inc()
    answer = httpx.get(f"{endpoint}/metrics", timeout=5)
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/plain")
    assert 'agent_tool_calls_total{status="success",tool="endpoint_probe"}' in answer.text
    # The deployment-wide gauges are the web's: not counted again per worker host.
    assert "agent_sessions" not in answer.text and "agent_queue_depth" not in answer.text
    assert httpx.get(f"{endpoint}/other", timeout=5).status_code == 404
    settings.METRICS_ALLOWED_NETWORKS = ["10.0.0.0/8"]
    refused = httpx.get(f"{endpoint}/metrics", timeout=5)
    assert refused.status_code == 404
    assert refused.json()["error"]["code"] == "not_found"


def test_with_a_token_the_token_is_required(endpoint: str, settings) -> None:
    settings.METRICS_TOKEN = "s3cret-token"
    assert httpx.get(f"{endpoint}/metrics", timeout=5).status_code == 404
    wrong = httpx.get(f"{endpoint}/metrics", headers={"Authorization": "Bearer no"}, timeout=5)
    assert wrong.status_code == 404
    right = {"Authorization": "Bearer s3cret-token"}
    assert httpx.get(f"{endpoint}/metrics", headers=right, timeout=5).status_code == 200


def test_every_worker_process_of_a_host_binds_the_same_port(endpoint: str, settings) -> None:
    settings.METRICS_TOKEN = ""
    settings.METRICS_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    port = int(endpoint.rsplit(":", 1)[1])
    second = metrics_endpoint_start(bind="127.0.0.1", port=port)
    assert second is not None
    try:
        assert all(httpx.get(f"{endpoint}/metrics", timeout=5).status_code == 200 for _ in range(4))
    finally:
        second.shutdown()
        second.server_close()


def test_a_port_another_program_holds_is_a_warning_not_a_crash(caplog) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        assert metrics_endpoint_start(bind="127.0.0.1", port=taken.getsockname()[1]) is None
    assert "worker metrics endpoint not started" in caplog.text
