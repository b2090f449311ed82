"""Prometheus metrics kept by the processes themselves: counters and histograms only.

Multiprocess-safe: with `PROMETHEUS_MULTIPROC_DIR` set (before any process
starts; `make run` sets it) each process writes its samples to files there
and the `/metrics` endpoint of any web process adds them up, so several
daphnes and workers report as one. Gauges that describe the database or
Redis (sessions by state, queue depth, approvals, credits, breakers) are
not kept here: `collector.py` reads them at scrape time.

Labels carry names the operator configured (endpoints, tools) and fixed
kinds, never anything a user or a model wrote.
"""

from typing import Any

from prometheus_client import Counter, Gauge, Histogram

# Seconds: model latencies run from tens of ms (a local model) to a minute.
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60, 120)
STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60)
COUNT_BUCKETS = (0, 1, 2, 3, 5, 8, 13, 21, 34, 55)

FIRST_TOKEN = Histogram(
    "agent_model_first_token_seconds",
    "Time from sending a model request to its first streamed event.",
    ["endpoint"],
    buckets=LATENCY_BUCKETS,
)
MODEL_CALL = Histogram(
    "agent_model_call_seconds",
    "Duration of a model call, first byte to last, failed ones included.",
    ["endpoint", "outcome"],
    buckets=LATENCY_BUCKETS,
)
STEP = Histogram(
    "agent_step_seconds",
    "Duration of one step of a run (model time included), by the state it ran in.",
    ["state"],
    buckets=STEP_BUCKETS,
)
MODEL_ERRORS = Counter(
    "agent_model_errors_total",
    "Failed model calls by endpoint and kind (timeout, unavailable, rate_limited, ...).",
    ["endpoint", "kind"],
)
MODEL_TOKENS = Counter(
    "agent_model_tokens_total",
    "Tokens of successful model calls, by endpoint and direction (input, output).",
    ["endpoint", "direction"],
)
TOOL_CALLS = Counter(
    "agent_tool_calls_total",
    "Tool calls that ran (or were refused before running), by tool and status.",
    ["tool", "status"],
)
TURN_TOOL_CALLS = Histogram(
    "agent_turn_tool_calls",
    "Tool calls a session made in one turn (observed when the turn ends on the worker that ran its tools).",
    buckets=COUNT_BUCKETS,
)
TOKEN_OVERRUNS = Counter(
    "agent_token_overruns_total",
    "Requests that did not fit an endpoint's context window (kind=context) and answers cut "
    "at the output limit (kind=output).",
    ["endpoint", "kind"],
)
BUDGET_REFUSALS = Counter(
    "agent_budget_refusals_total",
    "Model or tool calls refused by a budget (kind=budget), the owner's credits for a model "
    "call (kind=credits) or for a tool call (kind=tool_credits).",
    ["kind"],
)
RUNS = Counter(
    "agent_runs_total",
    "Runs (a worker holding a session's lease) by how they stopped.",
    ["stopped"],
)
TURNS = Counter("agent_turns_total", "Turns that ended, by stop reason.", ["stop_reason"])
WEBSOCKETS = Gauge(
    "agent_websocket_connections",
    "Open websocket connections (summed over live web processes).",
    multiprocess_mode="livesum",
)
PROMPT_SAMPLES = Counter(
    "agent_prompt_samples_total", "Model calls whose full prompt and answer were sampled."
)


# labels() looks its child up under a lock on every call; the step path keeps its own.
_step_children: dict[str, Any] = {}


def step_observe(state: str, seconds: float) -> None:
    """agent_step_seconds{state}.observe(seconds), with the labelled child cached."""
    child = _step_children.get(state)
    if child is None:
        child = _step_children[state] = STEP.labels(state)
    child.observe(seconds)
