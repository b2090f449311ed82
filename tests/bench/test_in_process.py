"""The in-process benchmarks still run against the engine as it is: a smoke run at tiny sizes.

They drive the engine's internals (`bench/stepkit.py` builds steps the way
`model_step` does; the tools benchmark checks the state a tool step leaves), so a
change to the engine can break them without any test of the engine failing: the
tools benchmark failed in every full `make bench` from the commit that folded the
tool-loop move into the results' commit until it was fixed. No figure is judged
here (timings belong to `make bench`); only that each benchmark runs and measures.
"""

import math
from typing import Any

import pytest

from bench import (
    billing,
    checkpoint,
    context,
    fixtures,
    memory_search,
    tool_dispatch,
    workflow_compare,
)
from bench.results_model import Result

# The benchmarks' helper threads (tools, the publisher) need committed rows.
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def bench_config() -> None:
    fixtures.install()


def _measured(result: Result) -> dict[str, float]:
    assert result.error == ""
    values = {f.key: f.value for f in result.figures}
    assert values, f"{result.name}: no figures"
    missing = [key for key, value in values.items() if value is None or math.isnan(value)]
    assert missing == [], f"{result.name}: nothing measured for {missing}"
    return {key: float(value) for key, value in values.items() if value is not None}


def test_the_tools_benchmark_runs_tool_steps(bench_config: None) -> None:
    values = _measured(tool_dispatch.run(executor_reps=5, sessions=2))
    # A tool step is the executor plus its reads and commit.
    assert values["tool_step_1_p50_ms"] > values["executor_1_p50_ms"] > 0
    assert values["tool_step_10_p50_ms"] > values["executor_10_p50_ms"] > 0


def test_the_checkpoint_benchmark_measures_the_step_commit(bench_config: None) -> None:
    values = _measured(checkpoint.run(demo_sessions=1, demo_turns=1, cycles=4, insert_reps=4))
    assert values["size_p50_bytes"] > 0


def test_the_context_benchmark_assembles_each_size(bench_config: None) -> None:
    values = _measured(context.run(steps=3))
    assert values["assembly_2000_p50_ms"] > 0
    assert values["assembly_growth_2000_vs_200"] > 0


def test_the_workflow_benchmarks_node_pass_times_nodes_and_agent_steps(bench_config: None) -> None:
    # The platform's half (the LangGraph side needs LangGraph and a database of its own);
    # it installs the engine benchmark's probe, which must find what it times.
    measured = workflow_compare._node_pass(fixtures.owner(), runs=2, profile_path=None)
    assert len(measured.node_overhead_ms) == 2 and min(measured.node_overhead_ms) > 0
    assert measured.step_overhead_ms and min(measured.step_cpu_ms) > 0
    # The chain's read-only tool nodes: one step, one commit each.
    assert measured.steps_per_run == fixtures.CHAIN_NODES
    assert measured.by_state["processing"]["commits_mean"] >= 1


def test_the_billing_benchmark_ranks_and_charts_every_rollup(
    bench_config: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A few users' rollups stand for the 10,000: the same statements, every figure filled.
    monkeypatch.setattr(billing, "USERS", 40)
    monkeypatch.setattr(billing, "CALLS", 4_000)
    result = billing.run(gate_reps=3, ranking_reps=1, ab_cycles=3)
    values = _measured(result)
    for key in ("models", "keys"):
        assert values[f"rankings_{key}_p50_ms"] > 0
    for stack in ("model", "agent"):
        for days in billing.SERIES_DAYS:
            assert values[f"series_{stack}_{days}d_p50_ms"] > 0
    spend = result.details["spend_rollups"]
    assert spend["endpoints"] == len(billing.ENDPOINTS)
    assert spend["keys"] > 40  # several keys per user, plus key 0 (no key)
    # The same calls, split between endpoints (rounded per row).
    assert 0.75 < spend["calls"] / result.details["rollups"]["calls"] < 1.25


def test_the_memory_benchmark_loads_and_searches_both_cases(
    bench_config: None, settings: Any
) -> None:
    # Tiny sizes: one large owner above a lowered exact-scan limit gets its own index.
    settings.MEMORY_EXACT_SCAN_MAX = 50
    values = _measured(
        memory_search.run(items=1_200, dims=16, queries=3, large_items=100, large_owners=1)
    )
    assert values["uniform_recall_at_10"] > 0
    assert values["large_p95_ms"] > 0
