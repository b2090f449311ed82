"""GET /metrics: who may read it, and the scrape-time gauges read from the tables and Redis."""

import pytest
from django.test import Client

from approvals.models import Approval
from observability import metrics
from record.models import Session
from tests.factories import SessionFactory

pytestmark = pytest.mark.django_db


def test_without_a_token_only_internal_addresses_are_served(settings) -> None:
    settings.METRICS_TOKEN = ""
    assert Client(REMOTE_ADDR="127.0.0.1").get("/metrics").status_code == 200
    outside = Client(REMOTE_ADDR="203.0.113.9").get("/metrics")
    assert outside.status_code == 404
    assert outside.json()["error"]["code"] == "not_found"
    settings.METRICS_ALLOWED_NETWORKS = ["10.0.0.0/8"]
    assert Client(REMOTE_ADDR="10.1.2.3").get("/metrics").status_code == 200
    assert Client(REMOTE_ADDR="127.0.0.1").get("/metrics").status_code == 404


def test_with_a_token_the_token_is_required_from_anywhere(settings) -> None:
    settings.METRICS_TOKEN = "s3cret-token"
    client = Client(REMOTE_ADDR="127.0.0.1")
    assert client.get("/metrics").status_code == 404
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 404
    ok = Client(REMOTE_ADDR="198.51.100.7").get(
        "/metrics", HTTP_AUTHORIZATION="Bearer s3cret-token"
    )
    assert ok.status_code == 200
    assert ok["Content-Type"].startswith("text/plain")


def test_gauges_are_read_from_the_database_at_scrape_time(settings) -> None:
    settings.METRICS_TOKEN = ""
    SessionFactory.create_batch(2, state="finished")
    SessionFactory(state="awaiting_approval")
    metrics.TOOL_CALLS.labels("probe_tool", "success").inc()
    text = Client().get("/metrics").content.decode()
    assert 'agent_sessions{state="finished"} 2.0' in text
    assert 'agent_sessions{state="awaiting_approval"} 1.0' in text
    assert "agent_runs_in_flight 0.0" in text
    assert "agent_approvals_pending 0.0" in text
    assert "agent_approvals_oldest_pending_seconds 0.0" in text
    assert "agent_credits_reserved 0.0" in text
    assert "agent_queue_depth{queue=" in text
    assert 'agent_tool_calls_total{status="success",tool="probe_tool"}' in text
    for source in (
        "queue",
        "breakers",
        "sessions_gauges",
        "approvals_pending_gauges",
        "credits_reserved_gauges",
    ):
        assert f'agent_metrics_source_up{{source="{source}"}} 1.0' in text
    assert Session.objects.count() == 3 and Approval.objects.count() == 0


def test_a_failing_source_is_reported_and_the_others_still_answer(settings, monkeypatch) -> None:
    from observability import collector

    settings.METRICS_TOKEN = ""

    def broken() -> list:
        raise RuntimeError("database away")

    monkeypatch.setattr(
        collector, "_sources", lambda: (("broken", broken), ("queue", collector.queue_gauges))
    )
    text = Client().get("/metrics").content.decode()
    assert 'agent_metrics_source_up{source="broken"} 0.0' in text
    assert 'agent_metrics_source_up{source="queue"} 1.0' in text
