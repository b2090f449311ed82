"""What a step ran against, and how far the world moved since (runtime-mechanisms 4.3).

Two parts, both kept in checkpoints:

- the environment (agent config, tools, model) with its fingerprint, recorded when
  it changes;
- what the model saw besides (`Seen`): the dialogue's intent and slots, the degradation
  level, the services whose circuit is open, the budgets left, the peak hour, the host's
  pressure, the tools under their SLA or out of quota; every model step records it.

When a forked, resumed or recovered run continues, or a run continues after a long pause,
the current values are compared with the recorded ones (`drift`). Each change weighs
something (`WEIGHTS`); past `ENV_DRIFT_THRESHOLD` the model is told what changed and asked
to re-plan before any side effect. A distance rather than "any change": a budget that
went from 81 % to 79 % left, or one slot the user just filled, is no reason to re-plan.
"""

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import cached_property
from typing import Any, TypedDict

from django.conf import settings
from django.utils import timezone

from billing.budgets import Budget, Spent
from billing.notices import NoticeCandidate
from billing.pressure import OwnerFigures
from engine.model.surroundings import Surroundings, surroundings
from record.models import Agent, Message, Session
from runtime.breaker import model_breaker
from tools.execution import ToolSnapshot, tool_breaker


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


class Seen(TypedDict, total=False):
    """What the model saw of its situation at a step, as a checkpoint records it."""

    intent: str | None
    slots: dict[str, Any]
    degradation: int
    degraded: list[str]  # "tool refund: unavailable (circuit open)", ...
    # Per budget with a limit, the share left in percent, rounded down to BUDGET_STEP
    # (a checkpoint need not follow every token).
    budgets: dict[str, int]
    # The world around the step (engine/model/surroundings.py): one of the agent's peak
    # hours (only when it declares some), the host's pressure ("cpu", "memory"), the tools
    # whose recent success rate is under their declared sla_rate, or out of quota.
    peak: bool
    pressure: list[str]
    below_sla: list[str]
    quota_out: list[str]


BUDGET_STEP = 10

# What each change weighs in the drift distance. A change of what the agent is or can do
# (its configuration, a tool, the model) is always worth a note; a change of the
# situation it works in adds up.
WEIGHTS: dict[str, float] = {
    "agent": 1.0,
    "tool": 1.0,
    "model": 1.0,
    "intent": 0.5,
    "slot": 0.5,
    "degradation": 0.5,  # per level
    "degraded": 0.5,  # per service that failed or came back
    "budget": 0.5,  # per 25 points of a budget's share left
    # The world crossing a line an operator drew is worth a note by itself.
    "peak": 1.0,
    "pressure": 1.0,  # per resource under pressure, or relieved
    "sla": 1.0,  # per tool that fell under its SLA, or came back
    "quota": 1.0,  # per tool out of quota, or with quota again
}
BUDGET_POINTS = 25
VALUE_MAX_CHARS = 60


@dataclass(frozen=True)
class Drift:
    """What changed since a recorded step, each change with its weight."""

    changes: list[tuple[str, float]] = field(default_factory=list)

    @property
    def distance(self) -> float:
        return sum(weight for _, weight in self.changes)

    def above(self, threshold: float) -> bool:
        return bool(self.changes) and self.distance >= threshold

    @property
    def texts(self) -> list[str]:
        return [text for text, _ in self.changes]


def _environment_changes(before: dict[str, Any], now: dict[str, Any]) -> list[tuple[str, float]]:
    changes: list[tuple[str, float]] = []
    if before.get("agent") != now.get("agent"):
        changes.append(("the agent's instructions or configuration were changed", WEIGHTS["agent"]))
    old_tools, new_tools = before.get("tools") or {}, now.get("tools") or {}
    added = sorted(set(new_tools) - set(old_tools))
    removed = sorted(set(old_tools) - set(new_tools))
    changed = sorted(n for n in set(old_tools) & set(new_tools) if old_tools[n] != new_tools[n])
    tool = WEIGHTS["tool"]
    if added:
        changes.append((f"tools now available: {', '.join(added)}", tool * len(added)))
    if removed:
        changes.append((f"tools no longer available: {', '.join(removed)}", tool * len(removed)))
    if changed:
        changes.append(
            (f"tools whose definition changed: {', '.join(changed)}", tool * len(changed))
        )
    if before.get("model") and now.get("model") and before["model"] != now["model"]:
        changes.append(
            (f"the model changed from {before['model']} to {now['model']}", WEIGHTS["model"])
        )
    return changes


def _shown(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return text if len(text) <= VALUE_MAX_CHARS else text[: VALUE_MAX_CHARS - 1] + "…"


def _seen_changes(before: Seen, now: Seen) -> list[tuple[str, float]]:
    """Only what both sides recorded is compared (a tool step does not read the budgets)."""
    changes: list[tuple[str, float]] = []
    if "intent" in before and "intent" in now and before["intent"] != now["intent"]:
        was = f" (was {_shown(before['intent'])})" if before["intent"] else ""
        changes.append(
            (f"the user's intent is now {_shown(now['intent'])}{was}", WEIGHTS["intent"])
        )
    if "slots" in before and "slots" in now:
        old, new = before["slots"] or {}, now["slots"] or {}
        for slot in sorted(set(old) | set(new)):
            if slot not in new:
                text = f"{slot} is no longer set (was {_shown(old[slot])})"
            elif slot not in old:
                text = f"{slot} is now {_shown(new[slot])}"
            elif old[slot] != new[slot]:
                text = f"{slot} is now {_shown(new[slot])} (was {_shown(old[slot])})"
            else:
                continue
            changes.append((text, WEIGHTS["slot"]))
    if "degradation" in before and "degradation" in now:
        levels = abs(now["degradation"] - before["degradation"])
        if levels:
            changes.append(
                (
                    f"the service's degradation level went from {before['degradation']} "
                    f"to {now['degradation']}",
                    WEIGHTS["degradation"] * levels,
                )
            )
    if "degraded" in before and "degraded" in now:
        old_set, new_set = set(before["degraded"]), set(now["degraded"])
        for item in sorted(new_set - old_set):
            changes.append((item, WEIGHTS["degraded"]))
        for item in sorted(old_set - new_set):
            service = item.split(":", 1)[0]
            changes.append((f"{service}: available again", WEIGHTS["degraded"]))
    if "peak" in before and "peak" in now and before["peak"] != now["peak"]:
        text = "it is now peak hours" if now["peak"] else "the peak hours are over"
        changes.append((text + f" (is_peak_hour {str(now['peak']).lower()})", WEIGHTS["peak"]))
    for key, weight, started, ended in (
        ("pressure", "pressure", "the host is under {} pressure", "the host's {} pressure is over"),
        ("below_sla", "sla", "tool {}: success rate under its SLA", "tool {}: back within its SLA"),
        ("quota_out", "quota", "tool {}: quota used up", "tool {}: quota available again"),
    ):
        if key in before and key in now:
            old_set, new_set = set(before[key]), set(now[key])  # type: ignore[literal-required]
            changes += [(started.format(n), WEIGHTS[weight]) for n in sorted(new_set - old_set)]
            changes += [(ended.format(n), WEIGHTS[weight]) for n in sorted(old_set - new_set)]
    if "budgets" in before and "budgets" in now:
        for label in sorted(set(before["budgets"]) & set(now["budgets"])):
            earlier, left = before["budgets"][label], now["budgets"][label]
            steps = abs(left - earlier) // BUDGET_POINTS
            if steps:
                changes.append(
                    (f"budget {label}: {left} % left (was {earlier} %)", WEIGHTS["budget"] * steps)
                )
    return changes


def drift(
    before_env: dict[str, Any] | None,
    now_env: dict[str, Any],
    before_seen: Seen | None,
    now_seen: Seen | None,
) -> Drift:
    """The changes between a recorded step and now, each weighed (`WEIGHTS`)."""
    changes = _environment_changes(before_env, now_env) if before_env else []
    if before_seen is not None and now_seen is not None:
        changes += _seen_changes(before_seen, now_seen)
    return Drift(changes)


@dataclass(frozen=True)
class GateRead:
    """What the gate reads before a model call, before the request exists: the budgets
    with their spend, the owner's figures (credits too) and the degradation level.
    The environment block is made from it, so it costs the step no read of its own."""

    budgets: list[tuple[Budget, Spent]]
    figures: OwnerFigures
    level: int
    model_failing: bool
    # The cost notices these figures cross (a budget nearing its limit, a low balance):
    # the gate returns them, the model phase raises them (a gate writes nothing).
    notices: tuple[NoticeCandidate, ...] = ()


def _budgets_left(read: GateRead) -> dict[str, int]:
    """Each limited budget's share left, in percent rounded down to BUDGET_STEP."""
    left: dict[str, int] = {}
    for budget, spent in read.budgets:
        shares = []
        if budget.tokens:
            shares.append(1 - spent.tokens / budget.tokens)
        if budget.cost:
            shares.append(float(1 - spent.cost / budget.cost))
        if shares:
            percent = int(max(0.0, min(shares)) * 100)
            left[budget.label] = percent - percent % BUDGET_STEP
    return left


def seen_of(
    state: dict[str, Any],
    degradation: int,
    degraded: list[str],
    read: GateRead | None,
    world: Surroundings,
) -> Seen:
    """What the model sees of its situation (recorded by every model step; compared after
    a pause: engine/gates/environment.py). `read` None: the budgets were not read."""
    seen: Seen = {
        "intent": state.get("intent"),
        "slots": dict(state.get("slots") or {}),
        "degradation": degradation,
        "degraded": sorted(degraded),
        "pressure": world.pressure,
        "below_sla": world.below_sla,
        "quota_out": world.quota_out,
    }
    if world.is_peak_hour is not None:
        seen["peak"] = world.is_peak_hour
    if read is not None:
        seen["budgets"] = _budgets_left(read)
    return seen


def seen_in_tool_step(session: Session, agent: Agent, tools: dict[str, ToolSnapshot]) -> Seen:
    """`seen_of` from what a tool step has at hand: the session's dialogue state and level,
    the circuit breakers this process knows open (no budget read)."""
    models = [agent.model.name]
    if agent.fallback_model is not None:
        models.append(agent.fallback_model.name)
    degraded = [
        f"model {n}: unavailable (circuit open)" for n in model_breaker().known_open(models)
    ]
    degraded += [
        f"tool {n}: unavailable (circuit open)" for n in tool_breaker().known_open(sorted(tools))
    ]
    return seen_of(
        session.dialogue_state or {},
        session.degradation_level or 0,
        degraded,
        None,
        surroundings(agent, tools),
    )


def model_paused(history: Sequence[Message], now: datetime | None = None) -> bool:
    """Has the model been silent longer than `ENV_CHECK_PAUSE_S`? Measured from its latest
    message in the history (the session row's `updated_at` cannot tell: the commit that
    starts a turn or records a decision moves it)."""
    latest = max(
        (m.created_at for m in history if m.role == "assistant" and m.created_at is not None),
        default=None,
    )
    return past_pause(latest, now)


def past_pause(since: datetime | None, now: datetime | None = None) -> bool:
    if since is None:
        return False
    return (now or timezone.now()) - since > timedelta(seconds=settings.ENV_CHECK_PAUSE_S)
