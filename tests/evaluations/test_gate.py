"""The rollout gate: what the candidate's latest evaluation must show before an agent's
candidate_percent rises, judged for apply_config (refused, or an audited override) and by
the rules themselves."""

import pytest

from audit.models import AuditEntry
from configuration.services import ConfigInvalid, config_apply
from evaluations.gate import rollout_gate_judge, rule_problem
from record.models import Agent, ModelEndpoint
from tests.factories import AgentFactory, EvaluationFactory, ModelEndpointFactory

pytestmark = pytest.mark.django_db

GATE = {"trajectory_match": ">= 0.9", "cost_ratio": "<= 1.2"}


@pytest.fixture
def gated() -> Agent:
    main = ModelEndpointFactory(name="main", api="rules")
    candidate = ModelEndpointFactory(name="candidate", api="rules")
    return AgentFactory(
        slug="gated", model=main, candidate_model=candidate, candidate_percent=5, rollout_gate=GATE
    )


def _config(percent: int, gate: dict[str, str] | None = None) -> dict[str, object]:
    agent: dict[str, object] = {
        "slug": "gated",
        "model": "main",
        "candidate_model": "candidate",
        "candidate_percent": percent,
    }
    if gate is not None:
        agent["rollout_gate"] = gate
    return {
        "models": [{"name": "main", "api": "rules"}, {"name": "candidate", "api": "rules"}],
        "agents": [agent],
    }


def test_no_rules_no_gate_and_no_evaluation_no_raise(gated: Agent) -> None:
    assert rollout_gate_judge(AgentFactory(slug="free", model=gated.model)).passed
    verdict = rollout_gate_judge(gated)
    assert not verdict.passed
    assert verdict.failures == ["no finished evaluation of candidate 'candidate'"]


def test_the_latest_finished_evaluation_of_the_candidate_decides(gated: Agent) -> None:
    EvaluationFactory(agent=gated, totals={"trajectory_match": 1.0, "cost_ratio": 1.0})
    assert rollout_gate_judge(gated).passed
    # A newer one that costs more: refused, naming the figure.
    EvaluationFactory(agent=gated, totals={"trajectory_match": 0.95, "cost_ratio": 1.5})
    verdict = rollout_gate_judge(gated)
    assert verdict.failures == ["cost_ratio is 1.5 (needs <= 1.2)"]
    # Running, failed and other candidates' evaluations do not count.
    EvaluationFactory(agent=gated, state="running", totals={})
    EvaluationFactory(agent=gated, candidate={"model": "other"}, totals={"cost_ratio": 1.0})
    assert rollout_gate_judge(gated).failures == ["cost_ratio is 1.5 (needs <= 1.2)"]


@pytest.mark.parametrize(
    ("metric", "rule"),
    [("speed", ">= 1"), ("cost_ratio", "1.2"), ("cost_ratio", "<= a lot"), ("cost_ratio", 1.2)],
)
def test_a_bad_rule_is_named(metric: str, rule: object) -> None:
    assert rule_problem(metric, rule)


def test_apply_config_refuses_a_raise_the_gate_does_not_allow_and_changes_nothing(
    gated: Agent,
) -> None:
    with pytest.raises(ConfigInvalid) as refused:
        config_apply(document=_config(50))
    assert "agents (gated).candidate_percent: 5 -> 50" in refused.value.errors[0]
    assert "no finished evaluation" in refused.value.errors[0]
    gated.refresh_from_db()
    assert gated.candidate_percent == 5
    # Lowering it is never refused; a passing evaluation lets it rise.
    config_apply(document=_config(2))
    EvaluationFactory(agent=gated, totals={"trajectory_match": 0.92, "cost_ratio": 1.1})
    config_apply(document=_config(50))
    gated.refresh_from_db()
    assert gated.candidate_percent == 50


def test_apply_config_with_the_override_raises_and_audits_it(gated: Agent) -> None:
    config_apply(document=_config(30), override_rollout_gate=True, actor="deploy:ops")
    gated.refresh_from_db()
    assert gated.candidate_percent == 30
    entry = AuditEntry.objects.get(action="rollout.override")
    assert entry.actor == "deploy:ops"
    assert entry.before == {"candidate_percent": 5} and entry.after == {"candidate_percent": 30}
    assert "no finished evaluation" in entry.reason


def test_apply_config_checks_the_rules_and_sets_them(gated: Agent) -> None:
    with pytest.raises(ConfigInvalid) as refused:
        config_apply(document=_config(5, {"speed": "> 1"}))
    assert refused.value.errors[0].startswith(
        "agents[0] (gated).rollout_gate.speed: unknown metric"
    )
    config_apply(document=_config(5, {"trajectory_match": ">= 0.8"}))
    gated.refresh_from_db()
    assert gated.rollout_gate == {"trajectory_match": ">= 0.8"}
    assert ModelEndpoint.objects.filter(name="candidate").exists()
