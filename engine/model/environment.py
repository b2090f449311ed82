"""What a step ran against (agent config, tools, model), and how to say what changed.

A checkpoint stores this environment and its fingerprint. When a forked or
resumed run continues, or a run continues after a long pause, the next model
step compares it with the current one and tells the model what changed.
"""

import hashlib
import json
from functools import cached_property
from typing import Any

from sessions.models import Agent
from tools.execution import ToolSnapshot


def agent_config_hash(agent: Agent) -> str:
    config = {
        "system_prompt": agent.system_prompt,
        "tools": sorted(agent.tools or []),
        "max_iterations": agent.max_iterations,
        "rules": agent.rules,
        "model": agent.model_id,
        "fallback": agent.fallback_model_id,
    }
    if agent.dialogue:  # only when set: the hash of an agent without one stays as it was
        config["dialogue"] = agent.dialogue
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:16]


class Environment(dict[str, Any]):
    """An environment that works out its fingerprint once.

    The per-process agent cache keeps one per role (`AgentRuntime.environment`)
    and replaces it with the runtime whenever a row it was built from changes, so
    it is never modified after it is made.
    """

    @cached_property
    def fingerprint(self) -> str:
        return _digest(self)


def environment(agent: Agent, tools: dict[str, ToolSnapshot], model: str | None) -> Environment:
    return Environment(
        agent=agent_config_hash(agent),
        tools={
            name: hashlib.sha256(f"{t.version}{t.parameters}".encode()).hexdigest()[:8]
            for name, t in sorted(tools.items())
        },
        model=model or "",
    )


def _digest(env: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(env, sort_keys=True).encode()).hexdigest()


def fingerprint(env: dict[str, Any]) -> str:
    return env.fingerprint if isinstance(env, Environment) else _digest(env)


def describe_changes(before: dict[str, Any], now: dict[str, Any]) -> list[str]:
    changes: list[str] = []
    if before.get("agent") != now.get("agent"):
        changes.append("the agent's instructions or configuration were changed")
    old_tools, new_tools = before.get("tools") or {}, now.get("tools") or {}
    added = sorted(set(new_tools) - set(old_tools))
    removed = sorted(set(old_tools) - set(new_tools))
    changed = sorted(n for n in set(old_tools) & set(new_tools) if old_tools[n] != new_tools[n])
    if added:
        changes.append(f"tools now available: {', '.join(added)}")
    if removed:
        changes.append(f"tools no longer available: {', '.join(removed)}")
    if changed:
        changes.append(f"tools whose definition changed: {', '.join(changed)}")
    if before.get("model") and now.get("model") and before["model"] != now["model"]:
        changes.append(f"the model changed from {before['model']} to {now['model']}")
    return changes
