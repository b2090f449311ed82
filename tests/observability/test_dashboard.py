"""The sample Grafana dashboard reads only metrics the platform exports."""

import json
import re
from pathlib import Path

from prometheus_client.metrics import MetricWrapperBase

from observability import metrics

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "agentplatform.json"
GAUGE_SOURCES = [
    "observability/collector.py",
    "sessions/selectors.py",
    "approvals/selectors.py",
    "billing/selectors.py",
]


def _exported() -> set[str]:
    names = {m._name for m in vars(metrics).values() if isinstance(m, MetricWrapperBase)}
    names.add("agent_metrics_source_up")
    for path in GAUGE_SOURCES:
        names |= set(re.findall(r'"(agent_[a-z_]+)"', (ROOT / path).read_text()))
    return names


def test_every_query_names_an_exported_metric() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exported = _exported()
    used = {
        re.sub(r"_(bucket|count|sum|total)$", "", name)
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"\bagent_[a-z_]+", target["expr"])
    }
    assert used and used <= exported, used - exported
    # And the headline figures the issue names are all on it.
    for wanted in (
        "agent_model_first_token_seconds", "agent_step_seconds", "agent_model_errors",
        "agent_tool_calls", "agent_turn_tool_calls", "agent_token_overruns",
        "agent_budget_refusals", "agent_queue_depth", "agent_runs_in_flight", "agent_sessions",
        "agent_websocket_connections", "agent_breaker_state", "agent_approvals_pending",
        "agent_approvals_oldest_pending_seconds", "agent_credits_reserved",
    ):  # fmt: skip
        assert wanted in used, wanted
