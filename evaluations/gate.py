"""The rollout gate: what the candidate model's latest evaluation must show before an
agent's `candidate_percent` may be raised (`Agent.rollout_gate`, e.g.
{"trajectory_match": ">= 0.9", "cost_ratio": "<= 1.2"}).

The rules are data: a metric of the evaluation's totals, a comparison and a number. An
agent without rules has no gate; lowering the percentage is never refused.
"""

import operator
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from record.models import Agent

from .models import Evaluation
from .selectors import latest_candidate_evaluation

METRICS = (
    "trajectory_match",
    "outcome_match",
    "answer_exact",
    "answer_similarity",
    "judge_score",
    "tokens_ratio",
    "cost_ratio",
    "latency_ratio",
    "would_have_called",
)
_OPS: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge,
    "<=": operator.le,
    ">": operator.gt,
    "<": operator.lt,
    "==": operator.eq,
}
_RULE = re.compile(r"^\s*(>=|<=|==|>|<)\s*(-?[0-9]+(?:\.[0-9]+)?)\s*$")


def rule_problem(metric: str, rule: Any) -> str | None:
    """Why this rule is not one (for the config's and the admin's checks), or None."""
    if metric not in METRICS:
        return f"unknown metric {metric!r}; one of: {', '.join(METRICS)}"
    if not isinstance(rule, str) or not _RULE.match(rule):
        return (
            f"{metric}: the rule must read like '>= 0.9' (one of >=, <=, >, <, ==, then a number)"
        )
    return None


@dataclass(frozen=True)
class GateVerdict:
    passed: bool
    evaluation: Evaluation | None
    failures: list[str] = field(default_factory=list)

    def message(self) -> str:
        if self.passed:
            return "the rollout gate passes"
        return "the rollout gate refuses: " + "; ".join(self.failures)


def rollout_gate_judge(agent: Agent, *, candidate_model: str | None = None) -> GateVerdict:
    """Does the latest finished evaluation of `agent`'s sessions on its candidate model
    (or `candidate_model`, the one being set) meet the agent's rules?"""
    rules: dict[str, Any] = dict(agent.rollout_gate or {})
    name = candidate_model or (agent.candidate_model.name if agent.candidate_model else None)
    if not rules:
        return GateVerdict(True, None)
    if name is None:
        return GateVerdict(False, None, ["the agent has no candidate model"])
    evaluation = latest_candidate_evaluation(agent.pk, {"model": name}) if agent.pk else None
    if evaluation is None:
        return GateVerdict(False, None, [f"no finished evaluation of candidate {name!r}"])
    failures = []
    for metric, rule in rules.items():
        problem = rule_problem(metric, rule)
        found = _RULE.match(rule) if problem is None else None
        if found is None:
            failures.append(problem or metric)
            continue
        value = (evaluation.totals or {}).get(metric)
        if value is None or not _OPS[found.group(1)](float(value), float(found.group(2))):
            failures.append(f"{metric} is {value} (needs {rule.strip()})")
    return GateVerdict(not failures, evaluation, failures)
