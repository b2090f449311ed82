"""What the benchmarks run: the demo's tools and agent on instant and slow `rules` models.

Everything goes through the real `config_apply` service, as `apply_config` does.

- `bench-demo`: the offline demo agent (config/demo.yaml) on an instant model.
  One request = turn start + 10 worker steps (4 model calls, the last one
  answering; 3 tool steps of 1, 3 and 1 calls; 3 tool-loop moves).
- `bench-echo`: answers at once, no tools (turn start + 1 worker step).
- `bench-one-round`: one tool round with the built-in clock tool
  (turn start + 3 worker steps: model -> tool (+ tool-loop move) -> model).
- `bench-one-round-2s`: the same on a rules model that sleeps 2 s per call.
- `bench-recovery`: the same on a rules model that sleeps 1 s per call (the
  `recovery` benchmark kills its worker mid-turn).
- `bench-noop`: an agent whose one tool, `bench_noop`, does nothing (the
  handler `bench.noop`, registered by this module, so only in this process:
  the `tools` benchmark runs its tool steps here, never in a worker).
- workflow `bench-chain`: ten tool nodes in a row, each calling the read-only
  python tool `bench_step` (handler `bench.step`, this process only) with the
  previous node's counter; it returns the counter plus one at once (the
  `workflow` benchmark's chain, against a LangGraph `StateGraph` of the same).
"""

import copy
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
DEMO_CONFIG = ROOT / "config" / "demo.yaml"
DEMO_REQUEST = (
    "find last week's orders with logistics exceptions, notify each customer, then write a report"
)
ROLE = "support"

INSTANT = "bench-instant"
SLOW = "bench-slow-2s"
SLOW_LATENCY_S = 2.0
RECOVERY_MODEL = "bench-slow-1s"
RECOVERY_LATENCY_S = 1.0
NOOP_HANDLER = "bench.noop"
NOOP_TOOL = "bench_noop"
LOREM_HANDLER = "bench.lorem"
LOREM_TOOL = "bench_lorem"
LOOP_CALLS = 10
# The scripted loop of the LangGraph comparison: one read-only call per model
# step, each with the previous result's counter (so no call repeats and none
# is answered from the cache), ten of them, then the answer.
LOOP_RULES = [
    {"name": "answer", "when": {"result": f'"n":{LOOP_CALLS}[,}}]'}, "answer": "done"},
    {"name": "call", "tool_calls": [{"tool": LOREM_TOOL, "args": {"n": "{{ result.n }}"}}]},
]
LOREM_TEXT = ("lorem ipsum dolor sit amet " * 16)[:400]
STEP_HANDLER = "bench.step"
STEP_TOOL = "bench_step"
CHAIN_WORKFLOW = "bench-chain"
CHAIN_NODES = 10


def chain_step(n: int) -> dict[str, Any]:
    """One node's work on both sides of the workflow comparison: the counter plus one."""
    return {"n": n + 1}


def chain_workflow() -> dict[str, Any]:
    """`CHAIN_NODES` tool nodes s1 -> s2 -> ... -> end, each passing on the counter (so no
    call repeats an earlier one and none is answered from the read-only cache)."""
    nodes: dict[str, Any] = {}
    for i in range(1, CHAIN_NODES + 1):
        nodes[f"s{i}"] = {
            "kind": "tool",
            "tool": STEP_TOOL,
            "args": {"n": "input.n" if i == 1 else f"s{i - 1}.n"},
            "output": f"s{i}",
            "next": f"s{i + 1}" if i < CHAIN_NODES else "end",
        }
    return {
        "slug": CHAIN_WORKFLOW,
        "name": f"bench: {CHAIN_NODES} instant tool nodes in a row (LangGraph comparison)",
        "role": ROLE,
        "input": {
            "type": "object",
            "properties": {"n": {"type": "integer"}},
            "required": ["n"],
            "additionalProperties": False,
        },
        "start": "s1",
        "result": f"s{CHAIN_NODES}",
        "model": INSTANT,
        "nodes": nodes,
    }


ONE_ROUND_RULES = [
    {
        "name": "ask-clock",
        "when": {"last_tool": None},
        "tool_calls": [{"tool": "bench_clock", "args": {}}],
    },
    {"name": "answer", "when": {"last_tool": "bench_clock"}, "answer": "It is {{ result.now }}."},
]


def _register_noop() -> None:
    from tools.registry import HANDLERS, tool_handler

    if NOOP_HANDLER not in HANDLERS:

        @tool_handler(NOOP_HANDLER)
        def noop(**_arguments: Any) -> dict[str, Any]:
            return {"ok": True}

    if LOREM_HANDLER not in HANDLERS:

        @tool_handler(LOREM_HANDLER)
        def lorem(n: int | None = None, **_arguments: Any) -> dict[str, Any]:
            return {"n": (n or 0) + 1, "text": LOREM_TEXT}

    if STEP_HANDLER not in HANDLERS:

        @tool_handler(STEP_HANDLER)
        def step(n: int) -> dict[str, Any]:
            return chain_step(n)


def config_document() -> dict[str, Any]:
    demo = yaml.safe_load(DEMO_CONFIG.read_text())
    demo_agent = next(a for a in demo["agents"] if a["slug"] == "order-support")
    agents = [
        {
            **copy.deepcopy(demo_agent),
            "slug": "bench-demo",
            "name": "bench: demo agent, instant model",
            "model": INSTANT,
        },
        {
            "slug": "bench-echo",
            "name": "bench: echo, instant model",
            "system_prompt": "Echo the user.",
            "model": INSTANT,
            "tools": [],
            "rules": [{"name": "echo", "answer": "Echo: {{ user }}"}],
        },
        {
            "slug": "bench-one-round",
            "name": "bench: one tool round, instant model",
            "system_prompt": "Tell the time.",
            "model": INSTANT,
            "tools": ["bench_clock"],
            "rules": ONE_ROUND_RULES,
        },
        {
            "slug": "bench-one-round-2s",
            "name": "bench: one tool round, 2 s model",
            "system_prompt": "Tell the time.",
            "model": SLOW,
            "tools": ["bench_clock"],
            "rules": ONE_ROUND_RULES,
        },
        {
            "slug": "bench-recovery",
            "name": "bench: one tool round, 1 s model",
            "system_prompt": "Tell the time.",
            "model": RECOVERY_MODEL,
            "tools": ["bench_clock"],
            "rules": ONE_ROUND_RULES,
        },
        {
            "slug": "bench-noop",
            "name": "bench: a tool that does nothing",
            "system_prompt": "Call the no-op tool.",
            "model": INSTANT,
            "tools": [NOOP_TOOL],
            "rules": [{"name": "answer", "answer": "done"}],
        },
        {
            "slug": "bench-loop",
            "name": "bench: ten read-only tool rounds, instant model (LangGraph comparison)",
            "system_prompt": "Call the tool ten times.",
            "model": INSTANT,
            "tools": [LOREM_TOOL],
            "max_iterations": LOOP_CALLS + 2,
            "rules": LOOP_RULES,
        },
    ]
    for agent in agents:
        agent.pop("fallback_model", None)
    # Whatever else the demo file declares (roles, ...) comes along unchanged.
    passthrough = {k: v for k, v in demo.items() if k not in ("models", "tools", "agents")}
    return {
        **passthrough,
        "models": [
            {"name": INSTANT, "api": "rules", "options": {}},
            {"name": SLOW, "api": "rules", "options": {"latency_s": SLOW_LATENCY_S}},
            {"name": RECOVERY_MODEL, "api": "rules", "options": {"latency_s": RECOVERY_LATENCY_S}},
        ],
        "tools": [
            *demo["tools"],
            {
                "name": "bench_clock",
                "description": "The current time (UTC).",
                "kind": "python",
                "handler": "builtin.current_time",
                "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
                "roles": [ROLE],
            },
            {
                "name": NOOP_TOOL,
                "description": "Does nothing (benchmark).",
                "kind": "python",
                "handler": NOOP_HANDLER,
                "parameters": {
                    "type": "object",
                    "properties": {"i": {"type": "integer"}, "tag": {"type": "string"}},
                    "required": ["i"],
                    "additionalProperties": False,
                },
                "roles": [ROLE],
            },
            {
                "name": LOREM_TOOL,
                "description": "Returns about 400 characters and a counter (benchmark).",
                "kind": "python",
                "handler": LOREM_HANDLER,
                "parameters": {
                    "type": "object",
                    "properties": {"n": {"type": ["integer", "null"]}},
                    "additionalProperties": False,
                },
                "roles": [ROLE],
            },
            {
                "name": STEP_TOOL,
                "description": "The counter plus one, at once (benchmark).",
                "kind": "python",
                "handler": STEP_HANDLER,
                "parameters": {
                    "type": "object",
                    "properties": {"n": {"type": "integer"}},
                    "required": ["n"],
                    "additionalProperties": False,
                },
                "roles": [ROLE],
            },
        ],
        "agents": agents,
        "workflows": [*passthrough.get("workflows", []), chain_workflow()],
    }


def install() -> list[str]:
    from configuration.services import config_apply
    from demo.services import demo_data_seed

    _register_noop()
    report = config_apply(document=config_document())
    demo_data_seed()
    return report


def owner(username: str = "bench") -> Any:
    from django.contrib.auth import get_user_model

    user, _ = get_user_model().objects.get_or_create(username=username)
    return user


def sessions_create(agent: str, count: int, username: str = "bench") -> list[Any]:
    from sessions.services import session_create

    user = owner(username)
    return [session_create(owner=user, agent_slug=agent, key_roles=[ROLE]) for _ in range(count)]


def api_key(username: str = "bench") -> str:
    from accounts.services import api_key_create

    return api_key_create(username=username, roles=[ROLE], name="bench").raw
