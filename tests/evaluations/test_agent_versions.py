"""Agent configuration versions and the candidate `{"agent_version": "<slug>@<n>"}`.

Every change of an agent's configuration (apply_config, the admin's form) stores an
immutable numbered snapshot, an unchanged one none; the backfill gives existing agents
version 1 with the same hash. An evaluation of the version before the one the sessions
were recorded on runs the replays on that version's prompt and tools, and its scores show
the difference; the recorded version against itself scores identical.
"""

import importlib
from typing import Any

import pytest
from django.apps import apps
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import reverse

from configuration.services import config_apply
from evaluations import selectors, services
from evaluations.models import Evaluation
from record.agent_config import agent_config_hash, agent_config_snapshot
from record.errors import InvalidInput
from record.models import Agent, AgentVersion, Session
from sessions.services import agent_version_record
from tests.factories import AgentFactory, ModelEndpointFactory, api_key_for
from tests.fakes.model_servers import FakeModelServer, Recorded, Reply

from .conftest import recorded_script
from .test_admin import _agent_post

OLD_PROMPT = "You only look orders up; you never compensate anyone."


def _document(**agent: Any) -> dict[str, Any]:
    return {
        "models": [{"name": "main", "api": "rules"}, {"name": "other", "api": "rules"}],
        "agents": [{"slug": "support", "model": "main", "system_prompt": "Be kind.", **agent}],
    }


def _versions(slug: str) -> list[tuple[int, str]]:
    return list(
        AgentVersion.objects.filter(agent__slug=slug)
        .order_by("number")
        .values_list("number", "source")
    )


@pytest.mark.django_db
def test_apply_config_stores_a_version_per_change_and_none_for_an_unchanged_apply() -> None:
    config_apply(document=_document(), actor="cli:ops")
    assert _versions("support") == [(1, "config")]
    first = AgentVersion.objects.get(agent__slug="support")
    assert first.actor == "cli:ops"
    assert first.config["system_prompt"] == "Be kind." and first.config["model"] == "main"
    assert "candidate_percent" not in first.config and "slug" not in first.config

    config_apply(document=_document())
    assert _versions("support") == [(1, "config")]  # unchanged: no version
    config_apply(document=_document(candidate_model="other", candidate_percent=5))
    assert _versions("support") == [(1, "config")]  # a rollout move is not a configuration

    config_apply(document=_document(system_prompt="Be brief.", max_iterations=3))
    assert _versions("support") == [(1, "config"), (2, "config")]
    second = AgentVersion.objects.get(agent__slug="support", number=2)
    assert (second.config["system_prompt"], second.config["max_iterations"]) == ("Be brief.", 3)
    # Immutable: version 1 still says what was applied then.
    first.refresh_from_db()
    assert first.config["system_prompt"] == "Be kind."


@pytest.mark.django_db
def test_the_admins_agent_form_stores_a_version_by_its_operator(client: Client) -> None:
    operator = get_user_model().objects.create_superuser("operator", "op@example.com", "pw")
    client.force_login(operator)
    agent = AgentFactory(slug="desk", model=ModelEndpointFactory(name="main", api="rules"))
    agent_version_record(agent=agent, actor="system", source="config")

    assert _agent_post(client, agent, max_iterations=5, candidate_model="").status_code == 302
    assert _versions("desk") == [(1, "config"), (2, "admin")]
    latest = AgentVersion.objects.get(agent=agent, number=2)
    assert latest.actor == "admin:operator" and latest.config["max_iterations"] == 5
    # Saved again unchanged: no version.
    assert _agent_post(client, agent, max_iterations=5, candidate_model="").status_code == 302
    assert len(_versions("desk")) == 2

    page = client.get(reverse("admin:agent_sessions_agent_change", args=[agent.pk]))
    html = page.content.decode()
    assert "desk@2" in html and "max_iterations" in html and "desk@1" in html


@pytest.mark.django_db
def test_the_backfill_gives_an_agent_version_one_with_the_live_hash(client: Client) -> None:
    agent = AgentFactory(slug="old", model=ModelEndpointFactory(name="main", api="rules"))
    migration = importlib.import_module("record.migrations.0038_agent_versions")
    migration.backfill(apps, None)
    (version,) = AgentVersion.objects.filter(agent=agent)
    assert (version.number, version.source) == (1, "backfill")
    agent.refresh_from_db()
    assert version.config_hash == agent_config_hash(agent_config_snapshot(agent))
    assert agent_version_record(agent=agent, actor="x", source="config") is None

    key = api_key_for("app")
    listed = client.get("/api/v1/agents/", HTTP_AUTHORIZATION=f"Bearer {key}").json()
    assert {"slug": "old", "name": agent.name, "version": 1} in listed


def _two_versions(agent: Agent) -> None:
    """Version 1: an older prompt offering only get_order; version 2: the agent as the
    sessions were recorded on it."""
    current = (agent.system_prompt, list(agent.tools))
    Agent.objects.filter(pk=agent.pk).update(system_prompt=OLD_PROMPT, tools=["get_order"])
    assert agent_version_record(agent=agent, actor="t", source="config").number == 1  # type: ignore[union-attr]
    Agent.objects.filter(pk=agent.pk).update(system_prompt=current[0], tools=current[1])
    assert agent_version_record(agent=agent, actor="t", source="config").number == 2  # type: ignore[union-attr]


def _evaluate(session: Session, candidate: dict[str, str]) -> Evaluation:
    evaluation = services.evaluation_create(
        owner=session.owner,
        actor="api:test",
        sessions=selectors.sessions_pick(owner_id=session.owner_id, ids=[str(session.pk)]),
        candidate=candidate,
    )
    assert services.evaluation_run(evaluation_id=evaluation.pk) == "finished"
    evaluation.refresh_from_db()
    return evaluation


def _offered(request: Recorded) -> list[str]:
    return sorted(t["function"]["name"] for t in request.body.get("tools") or [])


def _system(request: Recorded) -> str:
    return next(m["content"] for m in request.messages if m["role"] == "system")


@pytest.mark.django_db(transaction=True)
def test_the_version_before_scores_its_difference_and_the_recorded_one_scores_identical(
    recorded: Session, openai_server: FakeModelServer
) -> None:
    agent = recorded.agent
    _two_versions(agent)
    slug = agent.slug

    # The recorded version against itself: identical.
    openai_server.script(Reply(text="Hello! How can I help?"), *recorded_script())
    same = _evaluate(recorded, {"agent_version": f"{slug}@2"})
    for share in ("trajectory_match", "outcome_match", "answer_exact", "answer_similarity"):
        assert same.totals[share] == 1.0, (share, same.totals)

    # Version 1: its prompt and its one tool reach the model; without issue_coupon the
    # (scripted) model can only look the order up and apologise.
    seen: list[Recorded] = []

    def answer(text: str) -> Any:
        def reply(request: Recorded) -> Reply:
            seen.append(request)
            return Reply(text=text)

        return reply

    openai_server.script(
        answer("Hello! How can I help?"),
        recorded_script()[0],
        answer("Sorry, I cannot compensate you."),
    )
    before = _evaluate(recorded, {"agent_version": f"{slug}@1"})
    assert all(_offered(r) == ["get_order"] and OLD_PROMPT in _system(r) for r in seen)
    assert before.candidate_agent is not None
    assert before.candidate_agent.system_prompt == OLD_PROMPT
    assert before.totals["trajectory_match"] == 0.5 and before.totals["answer_exact"] == 0.5
    refund = next(t for t in before.turns.all() if t.turn == 2)
    assert [c["tool"] for c in refund.candidate["calls"]] == ["get_order"]
    assert [c["tool"] for c in refund.baseline["calls"]] == ["get_order", "issue_coupon"]


@pytest.mark.django_db(transaction=True)
def test_a_version_of_another_agent_or_an_unknown_one_is_refused_naming_the_field(
    recorded: Session,
) -> None:
    other = AgentFactory(slug="other-agent", model=recorded.agent.model)
    agent_version_record(agent=other, actor="t", source="config")
    agent_version_record(agent=recorded.agent, actor="t", source="config")
    for value, code in (
        ("other-agent@1", "agent_version_mismatch"),
        (f"{recorded.agent.slug}@9", "unknown_agent_version"),
        (recorded.agent.slug, "invalid_input"),
    ):
        with pytest.raises(InvalidInput) as refused:
            services.evaluation_create(
                owner=recorded.owner,
                actor="api:test",
                sessions=[recorded],
                candidate={"agent_version": value},
            )
        assert (refused.value.code, refused.value.details["field"]) == (
            code,
            "candidate.agent_version",
        ), value
    assert not Evaluation.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_the_admins_add_form_takes_an_agent_version(recorded: Session, client: Client) -> None:
    client.force_login(get_user_model().objects.create_superuser("op", "op@example.com", "pw"))
    agent_version_record(agent=recorded.agent, actor="t", source="config")
    add = reverse("admin:evaluations_evaluation_add")
    slug = recorded.agent.slug
    refused = client.post(
        add, {"session_ids": str(recorded.pk), "candidate_agent_version": f"{slug}@7"}
    )
    assert "has no configuration version 7" in refused.content.decode()
    created = client.post(
        add, {"session_ids": str(recorded.pk), "candidate_agent_version": f"{slug}@1"}
    )
    assert created.status_code == 302, created.content
    assert Evaluation.objects.get().candidate == {"agent_version": f"{slug}@1"}


@pytest.mark.django_db(transaction=True)
def test_a_turn_records_the_version_it_ran_on_and_the_baseline_names_it(
    recorded: Session, openai_server: FakeModelServer, client: Client
) -> None:
    from .conftest import run_turn

    agent = recorded.agent
    assert recorded.agent_version_id is None  # its turns ran before any version
    first = agent_version_record(agent=agent, actor="t", source="config")
    openai_server.script(Reply(text="Anything else?"))
    session = run_turn(recorded, "thanks")
    assert session.agent_version == first

    Agent.objects.filter(pk=agent.pk).update(system_prompt="Be brief.")
    second = agent_version_record(agent=agent, actor="t", source="config")
    assert second is not None and second.number == 2
    openai_server.script(Reply(text="Bye."))
    session = run_turn(session, "bye")
    assert session.agent_version == second

    key = api_key_for(session.owner.username)
    read = client.get(f"/api/v1/sessions/{session.pk}/", HTTP_AUTHORIZATION=f"Bearer {key}")
    assert read.json()["agent_version"] == f"{agent.slug}@2"

    evaluation = services.evaluation_create(
        owner=session.owner,
        actor="api:test",
        sessions=selectors.sessions_pick(owner_id=session.owner_id, ids=[str(session.pk)]),
        candidate={"agent_version": f"{agent.slug}@1"},
    )
    assert selectors.evaluation_report(evaluation)["recorded_on"] == [f"{agent.slug}@2"]

    client.force_login(get_user_model().objects.create_superuser("op", "op@example.com", "pw"))
    page = client.get(reverse("admin:evaluations_evaluation_change", args=[evaluation.pk]))
    assert "baseline recorded on" in page.content.decode().lower()
    assert f"{agent.slug}@2" in page.content.decode()
    page = client.get(reverse("admin:agent_sessions_session_change", args=[session.pk]))
    assert f"{agent.slug}@2" in page.content.decode()
