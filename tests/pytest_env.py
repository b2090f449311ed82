"""Loaded with `-p` before Django settings: environment for the test run.

A queue of its own keeps a `make run` worker on the same Redis from taking
the tests' tasks.
"""

import os
import sys

os.environ.setdefault("CELERY_QUEUE", f"agentplatform-test-{os.getpid()}")
os.environ.setdefault("SESSION_PICKUP_GRACE_S", "3")
# A test database per run: two runs at once (or a run beside `make bench`) never collide.
os.environ.setdefault("TEST_DATABASE_NAME", f"test_agentplatform_{os.getpid()}")
# Breakers, cancel signals, limits and websocket groups of this run live under their own
# Redis prefixes.
os.environ.setdefault("REDIS_KEY_PREFIX", f"test-{os.getpid()}")
os.environ.setdefault("CHANNEL_LAYER_PREFIX", f"asgi-test-{os.getpid()}")
# pytest-xdist's workers inherit the controller's environment, so the names above would be
# shared by every worker: each worker takes its own (pytest-django adds the worker's id
# to the test database's name itself). Their stacks and in-process runs then never take
# each other's tasks, signals or frames.
_worker = os.environ.get("PYTEST_XDIST_WORKER")
if _worker:
    for _name in ("CELERY_QUEUE", "REDIS_KEY_PREFIX", "CHANNEL_LAYER_PREFIX"):
        os.environ[_name] = f"{os.environ[_name]}-{_worker}"
# Every test calls from 127.0.0.1, so the whole run's wrong keys would add up to
# a slow-down of that one address; tests of the slow-down set their own limit.
os.environ.setdefault("AUTH_FAIL_LIMIT", "100000")
# Likewise per key prefix: many tests present the same wrong key ("ap_wrong").
os.environ.setdefault("AUTH_FAIL_PREFIX_LIMIT", "100000")
# The same for the per-key REST rate: a load or fuzz test makes more requests a minute
# with one key than a client should; the rate's own test sets its limit.
os.environ.setdefault("API_RATE_LIMIT", "100000")
# Sampled prompts are an extra write on 1% of model steps: tests that count a step's
# round trips must not meet one by chance; the sampling tests set their own rate.
os.environ.setdefault("PROMPT_SAMPLE_RATE", "0")
# Traces stay off unless a test turns them on for a stack of its own.
for _name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
    os.environ.pop(_name, None)
# The stdio MCP servers the tests start (the test server under this interpreter, the published
# mcp-server-time); live stacks inherit it.
os.environ.setdefault(
    "MCP_STDIO_COMMANDS",
    ",".join([sys.executable, os.path.join(os.path.dirname(sys.executable), "mcp-server-time")]),
)
# A decision goes on at once, as most tests expect; the undo window's own tests set one.
os.environ.setdefault("APPROVAL_UNDO_S", "0")
# The offline `rules` model is strict, as a real provider is: a rule calling a tool the
# request did not offer fails (llm/rules.py; tests/conftest.py asserts none did).
os.environ.setdefault("RULES_MODEL_STRICT", "1")
# The tests' own servers (fake model endpoints, business APIs, webhook receivers, MCP servers)
# listen on loopback, which the egress policy refuses unless listed (runtime/egress.py); the
# live stacks inherit this. The policy's own tests override it.
os.environ.setdefault("EGRESS_ALLOW", "127.0.0.0/8,::1,localhost")
# A loaded test machine's load average must not be a drift in tests that are not about it
# (engine/model/environment.py); the host pressure's own tests set their thresholds.
os.environ.setdefault("ENV_HOST_CPU_HIGH", "0")
os.environ.setdefault("ENV_HOST_MEM_LOW_MB", "0")
