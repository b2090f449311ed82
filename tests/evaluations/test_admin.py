"""The admin: an evaluation started from its add page, its report (totals, the turns that
differ first, calls and answers side by side), cancel; and the agent page's rollout gate
beside candidate_percent, refusing a raise without a passing evaluation unless a superuser
overrides it with a reason (audited)."""

import json
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import reverse

from audit.models import AuditEntry
from evaluations import services
from evaluations.models import Evaluation
from record.models import Agent, Session
from tests.factories import (
    AgentFactory,
    EvaluationFactory,
    ModelEndpointFactory,
    StaffUserFactory,
    permissions,
)
from tests.fakes.model_servers import Call, FakeModelServer, Reply

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def operator(client: Client) -> Any:
    user = get_user_model().objects.create_superuser("operator", "op@example.com", "pw-not-used")
    client.force_login(user)
    return user


def test_an_operator_starts_an_evaluation_and_reads_the_turns_that_differ_first(
    client: Client, operator: Any, recorded: Session, openai_server: FakeModelServer
) -> None:
    add = reverse("admin:evaluations_evaluation_add")
    blank = client.get(add)
    assert blank.status_code == 200
    # Its page is read-only: "Save and continue editing" would lead there as if editable.
    assert 'name="_continue"' not in blank.content.decode()
    assert 'name="_save"' in blank.content.decode()
    refused = client.post(add, {"session_ids": str(recorded.pk)})
    assert (
        "Give a candidate model, a candidate system prompt, a candidate agent version or a "
        "candidate workflow version (one)" in refused.content.decode()
    )
    response = client.post(
        add, {"session_ids": str(recorded.pk), "candidate_system_prompt": "Cancel, never refund."}
    )
    assert response.status_code == 302, response.content
    evaluation = Evaluation.objects.get()
    assert evaluation.actor == "admin:operator" and evaluation.total == 2
    openai_server.script(
        Reply(text="Hello! How can I help?"),
        Reply(calls=[Call("cancel_order", {"number": "SO-1001"})]),
        Reply(text="Cancelled."),
    )
    services.evaluation_run(evaluation_id=evaluation.pk)

    page = client.get(reverse("admin:evaluations_evaluation_change", args=[evaluation.pk]))
    assert page.status_code == 200
    html = page.content.decode()
    assert html.index("differs") < html.index("same")  # the differing turn comes first
    assert "cancel_order({&quot;number&quot;: &quot;SO-1001&quot;})" in html
    assert "would have called" in html
    listed = client.get(reverse("admin:evaluations_evaluation_changelist")).content.decode()
    assert "trajectory 50%" in listed


def test_the_add_page_refuses_a_filter_that_matches_nothing(client: Client, operator: Any) -> None:
    response = client.post(
        reverse("admin:evaluations_evaluation_add"),
        {"search": "nobody said this", "candidate_system_prompt": "x"},
    )
    assert response.status_code == 200
    assert "no recorded session matches" in response.content.decode()
    assert not Evaluation.objects.exists()


def _agent_post(client: Client, agent: Agent, **changes: Any) -> Any:
    url = reverse("admin:agent_sessions_agent_change", args=[agent.pk])
    page = client.get(url)
    data = {k: v for k, v in page.context["adminform"].form.initial.items() if v is not None}
    data.update(
        slug=agent.slug,
        model=agent.model_id,
        fallback_model="",
        candidate_model=agent.candidate_model_id,
        tools=[],
        rules="[]",
        dialogue="{}",
        context_budget="{}",
        rollout_gate=json.dumps(agent.rollout_gate),
        enabled="on",
    )
    data.update(changes)
    return client.post(url, data)


def _errors(response: Any) -> str:
    errors = response.context["adminform"].form.errors
    return " ".join(m for messages in errors.values() for m in messages)


@pytest.fixture
def gated() -> Agent:
    main = ModelEndpointFactory(name="main", api="rules")
    candidate = ModelEndpointFactory(name="candidate", api="rules")
    return AgentFactory(
        slug="gated",
        model=main,
        candidate_model=candidate,
        candidate_percent=5,
        rollout_gate={"trajectory_match": ">= 0.9"},
    )


def test_the_agent_page_refuses_a_raise_without_a_passing_evaluation(
    client: Client, operator: Any, gated: Agent
) -> None:
    page = client.get(reverse("admin:agent_sessions_agent_change", args=[gated.pk]))
    assert "no finished evaluation (the gate refuses a raise)" in page.content.decode()
    refused = _agent_post(client, gated, candidate_percent=50)
    assert refused.status_code == 200
    assert "no finished evaluation of candidate" in _errors(refused)
    EvaluationFactory(agent=gated, totals={"trajectory_match": 0.5})
    refused = _agent_post(client, gated, candidate_percent=50)
    assert "trajectory_match is 0.5 (needs >= 0.9)" in _errors(refused)
    # Lowering is never refused.
    assert _agent_post(client, gated, candidate_percent=1).status_code == 302
    passing = EvaluationFactory(agent=gated, totals={"trajectory_match": 0.95})
    page = client.get(reverse("admin:agent_sessions_agent_change", args=[gated.pk]))
    assert f"evaluation {passing.pk}</a>: trajectory 0.95" in page.content.decode()
    assert _agent_post(client, gated, candidate_percent=50).status_code == 302
    gated.refresh_from_db()
    assert gated.candidate_percent == 50


def test_only_a_superuser_overrides_the_gate_with_a_reason_and_it_is_audited(
    client: Client, gated: Agent
) -> None:
    staff = StaffUserFactory(
        username="staffer", perms=["agent_sessions.change_agent", "agent_sessions.view_agent"]
    )
    client.force_login(staff)
    refused = _agent_post(
        client, gated, candidate_percent=50, override_rollout_gate="on", override_reason="trust me"
    )
    assert "Only a superuser may override" in _errors(refused)

    boss = get_user_model().objects.create_superuser("boss", "b@example.com", "pw-not-used")
    client.force_login(boss)
    no_reason = _agent_post(client, gated, candidate_percent=50, override_rollout_gate="on")
    assert "Say why" in _errors(no_reason)
    done = _agent_post(
        client,
        gated,
        candidate_percent=50,
        override_rollout_gate="on",
        override_reason="incident 42",
    )
    assert done.status_code == 302
    gated.refresh_from_db()
    assert gated.candidate_percent == 50
    entry = AuditEntry.objects.get(action="rollout.override")
    assert (entry.actor, entry.reason) == ("admin:boss", "incident 42")
    assert entry.after == {"candidate_percent": 50}


# Tenancy (issue 43): a staff user who is not a superuser reaches their own tenant's
# evaluations only, evaluates only their tenant's sessions, and reads the turns' calls and
# answers only with view_message_content, as on the sessions' own pages.

EVALUATION_PERMS = [
    "evaluations.view_evaluation",
    "evaluations.add_evaluation",
    "evaluations.change_evaluation",
]


def _evaluation_with_a_turn(owner: Any, session: Session) -> Evaluation:
    evaluation: Evaluation = EvaluationFactory(owner=owner, agent=session.agent)
    evaluation.turns.create(
        session=session,
        turn=1,
        baseline={"calls": [], "outcome": "answered", "answer": "RECORDED-ANSWER-PLANTED"},
        candidate={"calls": [], "outcome": "answered", "answer": "CANDIDATE-ANSWER-PLANTED"},
    )
    return evaluation


def test_a_staff_user_who_owns_nothing_reaches_no_other_tenants_evaluation_or_session(
    client: Client, recorded: Session
) -> None:
    staff = StaffUserFactory(perms=[*EVALUATION_PERMS, "agent_sessions.view_message_content"])
    client.force_login(staff)
    theirs = _evaluation_with_a_turn(recorded.owner, recorded)

    listed = client.get(reverse("admin:evaluations_evaluation_changelist"))
    assert listed.status_code == 200 and f"evaluation {theirs.pk}" not in listed.content.decode()
    page = client.get(reverse("admin:evaluations_evaluation_change", args=[theirs.pk]))
    assert page.status_code == 302  # the admin's "does not exist", back to the index
    assert "PLANTED" not in client.get(page.url).content.decode()
    # Replaying another tenant's conversation would show its turns: refused by id and by
    # filter (the filter finds none of the staff user's own), nothing created.
    add = reverse("admin:evaluations_evaluation_add")
    for picked in ({"session_ids": str(recorded.pk)}, {"agent_slug": recorded.agent.slug}):
        response = client.post(add, {**picked, "candidate_system_prompt": "Be brief."})
        assert response.status_code == 200, picked
        assert response.context["adminform"].form.errors, picked
    assert Evaluation.objects.filter(owner=staff).count() == 0


def test_the_turns_of_an_own_evaluation_need_view_message_content(
    client: Client, recorded: Session
) -> None:
    staff = StaffUserFactory(perms=EVALUATION_PERMS)
    client.force_login(staff)
    own = _evaluation_with_a_turn(staff, recorded)

    html = client.get(reverse("admin:evaluations_evaluation_change", args=[own.pk])).content
    assert b"PLANTED" not in html
    assert b"hidden: needs the view_message_content permission" in html
    assert b"trajectory_match" in html  # the totals stay
    # Which sessions a text search finds would tell what they said.
    response = client.post(
        reverse("admin:evaluations_evaluation_add"),
        {"search": "compensate", "candidate_system_prompt": "Be brief."},
    )
    assert "view_message_content" in str(response.context["adminform"].form.errors["search"])

    staff.user_permissions.add(*permissions("agent_sessions.view_message_content"))
    client.force_login(get_user_model().objects.get(pk=staff.pk))  # permissions read afresh
    html = client.get(reverse("admin:evaluations_evaluation_change", args=[own.pk])).content
    assert b"RECORDED-ANSWER-PLANTED" in html and b"CANDIDATE-ANSWER-PLANTED" in html
    # No view permission on sessions: their pages would answer 403, so no links to them.
    session_page = reverse("admin:agent_sessions_session_change", args=[recorded.pk])
    assert client.get(session_page).status_code == 403
    assert session_page.encode() not in html and str(recorded.pk)[:8].encode() in html

    staff.user_permissions.add(*permissions("agent_sessions.view_session"))
    client.force_login(get_user_model().objects.get(pk=staff.pk))
    html = client.get(reverse("admin:evaluations_evaluation_change", args=[own.pk])).content
    assert session_page.encode() in html


def test_starting_and_cancelling_an_evaluation_in_the_admin_is_audited(
    client: Client, operator: Any, recorded: Session
) -> None:
    response = client.post(
        reverse("admin:evaluations_evaluation_add"),
        {"session_ids": str(recorded.pk), "candidate_system_prompt": "Cancel, never refund."},
    )
    assert response.status_code == 302, response.content
    evaluation = Evaluation.objects.get()
    client.post(
        reverse("admin:evaluations_evaluation_changelist"),
        {"action": "cancel", "_selected_action": [evaluation.pk]},
    )

    entries = AuditEntry.objects.filter(object_type="evaluations.evaluation").order_by("id")
    assert [(e.action, e.actor, e.object_id) for e in entries] == [
        ("evaluation.create", "admin:operator", str(evaluation.pk)),
        ("evaluation.cancel", "admin:operator", str(evaluation.pk)),
    ]
    created, cancelled = entries
    assert created.after["candidate"] == {"system_prompt": "Cancel, never refund."}
    assert created.data["sessions"] == [str(recorded.pk)] and created.owner_id == operator.pk
    assert cancelled.after == {"state": "cancelled"}


def test_another_agents_call_in_a_replay_is_marked_from_the_record(
    client: Client, operator: Any
) -> None:
    """A workflow's agent node (an `agent.<slug>` call) is answered from the record in a
    replay, its model not run again: the report says so, in the admin and over REST; a
    call that was not sent is a "would have called", not "from the record"."""
    from evaluations.selectors import evaluation_report
    from tests.factories import SessionFactory

    session = SessionFactory()
    evaluation: Evaluation = EvaluationFactory(owner=operator, agent=session.agent)
    triage = {"tool": "agent.triage", "arguments": {"input": "late order"}}
    other = {"tool": "agent.refunds", "arguments": {"input": "late order"}}
    lookup = {"tool": "get_order", "arguments": {"number": "SO-1"}}
    evaluation.turns.create(
        session=session, turn=1,
        baseline={"calls": [triage, lookup], "outcome": "finished", "answer": "{}", "path": ["a"]},
        candidate={
            "calls": [triage, lookup, other], "outcome": "finished", "answer": "{}",
            "path": ["a"], "would_have_called": [other],
        },
    )  # fmt: skip
    turn = evaluation_report(evaluation)["turns"][0]
    assert [c.get("from_record") for c in turn["candidate"]["calls"]] == [True, None, None]
    assert all("from_record" not in c for c in turn["baseline"]["calls"])

    html = client.get(reverse("admin:evaluations_evaluation_change", args=[evaluation.pk]))
    assert html.content.decode().count(">from the record</small>") == 1
