"""A workflow version as an evaluation's candidate, in process on the real engine
(PostgreSQL, Redis): recorded runs of a refund workflow (a read-only lookup, a condition, a
person's review, a side-effecting notice, an llm node on the strict fake OpenAI-compatible
server) replayed on a version. The recorded version against its own runs scores identical
and sends nothing; a version that notifies someone else shows the divergence in its path,
outcome and calls, and the notice is never sent.

`transaction=True`: tools run on helper threads with their own database connections.
"""

import threading
from collections import Counter
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any

import pytest
import yaml
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import reverse

from accounts.services import approver_grant
from approvals.models import Approval
from billing.models import UsageDaily
from engine import run_cache, session_run
from evaluations import selectors, services
from evaluations.models import Evaluation
from record.errors import InvalidInput
from record.models import ModelEndpoint, Session, ToolCall
from sessions.services import approval_decide
from tests.factories import SessionFactory, ToolFactory, UserFactory, api_key_for
from tests.fakes.model_servers import FakeModelServer, Reply
from tests.sessions.api.conftest import Api, assert_error
from tools.registry import tool_handler
from workflows.models import Workflow, WorkflowVersion
from workflows.selectors import definition_check, workflows_with_run_figures
from workflows.services import workflow_apply, workflow_run_start

pytestmark = pytest.mark.django_db(transaction=True)

URL = "/api/v1/evaluations/"
RAN: Counter[str] = Counter()
_lock = threading.Lock()


@tool_handler("tests.evalwf.lookup")
def _lookup(number: str) -> dict[str, Any]:
    with _lock:
        RAN["lookup"] += 1
    return {"number": number, "total": 60.5 if number.endswith("1") else 20, "customer_id": 7}


@tool_handler("tests.evalwf.notify")
def _notify(customer: int) -> dict[str, Any]:
    with _lock:
        RAN["notify"] += 1
    return {"sent_to": customer}


REFUND = """
slug: {slug}
role: support
model: {model}
input: {{type: object, properties: {{number: {{type: string}}}}, required: [number]}}
start: lookup
result: answer
nodes:
  lookup: {{kind: tool, tool: eval_lookup, args: {{number: input.number}}, output: order, next: check}}
  check:
    kind: condition
    cases: [{{when: "order.total > 50", next: review}}]
    default: tell
  review:
    kind: human
    summary: "{summary} {{{{ order.total }}}} on {{{{ input.number }}}}"
    output: decision
    next: notify
    rejected: tell
  notify: {{kind: tool, tool: eval_notify, args: {{customer: {customer}}}, output: sent, next: tell}}
  tell: {{kind: llm, prompt: "Tell the customer about {{{{ input.number }}}}", output: answer, next: end}}
"""


@pytest.fixture(autouse=True)
def _forget() -> Iterator[None]:
    RAN.clear()
    run_cache._workflows.clear()
    yield


@pytest.fixture
def flow(endpoint_on: Callable[[str], ModelEndpoint], unique: str) -> Callable[..., str]:
    """Apply the refund workflow (a new version each time its text changes); its slug."""
    endpoint = endpoint_on("flow")
    slug = f"refund-{unique}"
    schema = {"type": "object", "additionalProperties": False}
    ToolFactory(
        name="eval_lookup",
        handler="tests.evalwf.lookup",
        parameters={**schema, "properties": {"number": {"type": "string"}}},
        roles=["support"],
    )
    ToolFactory(
        name="eval_notify",
        handler="tests.evalwf.notify",
        side_effects=True,
        parameters={**schema, "properties": {"customer": {"type": "integer"}}},
        roles=["support"],
    )

    def apply(customer: str = "order.customer_id", summary: str = "Refund") -> str:
        text = REFUND.format(slug=slug, model=endpoint.name, customer=customer, summary=summary)
        raw = yaml.safe_load(text)
        workflow_apply(definition=definition_check(raw, where="t"), where="t")
        return slug

    apply()
    return apply


def _recorded_runs(slug: str, openai_server: FakeModelServer) -> tuple[Any, list[Session]]:
    """Two recorded runs: SO-2 (small: no review) and SO-1 (reviewed, approved, notified)."""
    owner = UserFactory(username=f"wf-owner-{slug}")
    approver = UserFactory(username=f"wf-approver-{slug}")
    approver_grant(username=approver.username, groups=["approvers"])
    runs = []
    for number, answer in (("SO-2", "Refund on SO-2 done."), ("SO-1", "Refund on SO-1 done.")):
        openai_server.script(Reply(text=answer))
        run, _ = workflow_run_start(
            owner=owner, key_roles=["support"], slug=slug, input={"number": number}
        )
        session_run(session_id=run.pk)
        for approval in Approval.objects.filter(session=run, status="pending"):
            approval_decide(
                approval_id=approval.pk, approve=True, user=approver, groups=["approvers"]
            )
            session_run(session_id=run.pk)
        run = Session.objects.get(pk=run.pk)
        assert run.state == "finished", (run.state, run.workflow_state)
        runs.append(run)
    assert Counter(lookup=2, notify=1) == RAN
    return owner, runs


def _evaluate(owner: Any, slug: str, candidate: str, **fields: Any) -> Evaluation:
    evaluation = services.evaluation_create(
        owner=owner,
        actor="api:test",
        sessions=selectors.sessions_pick(owner_id=owner.pk, workflow=slug),
        candidate={"workflow_version": candidate},
        **fields,
    )
    assert services.evaluation_run(evaluation_id=evaluation.pk) == "finished", evaluation.error
    evaluation.refresh_from_db()
    return evaluation


def test_a_version_replayed_against_its_own_runs_scores_identical_and_sends_nothing(
    flow: Callable[..., str], openai_server: FakeModelServer
) -> None:
    slug = flow()
    owner, runs = _recorded_runs(slug, openai_server)
    RAN.clear()
    approvals = Approval.objects.count()
    usage = sum(UsageDaily.objects.filter(owner=owner).values_list("model_calls", flat=True))
    # The llm nodes run for real on the version's model: the same answers again.
    openai_server.script(Reply(text="Refund on SO-2 done."), Reply(text="Refund on SO-1 done."))

    evaluation = _evaluate(owner, slug, f"{slug}@1")

    assert evaluation.done == evaluation.total == 2
    totals = evaluation.totals
    for share in ("trajectory_match", "outcome_match", "answer_exact", "answer_similarity"):
        assert totals[share] == 1.0, (share, totals)
    assert totals["cost_ratio"] == totals["tokens_ratio"] == 1.0
    assert totals["would_have_called"] == 0
    # Answered from the record: no tool ran, no approval was asked for.
    assert Counter() == RAN
    assert Approval.objects.count() == approvals
    reviewed = next(t for t in evaluation.turns.all() if t.session_id == runs[1].pk)
    assert reviewed.baseline["path"] == ["lookup", "check", "review", "notify", "tell"]
    assert reviewed.candidate["path"] == reviewed.baseline["path"]
    assert reviewed.candidate["outcome"] == "finished"
    assert reviewed.candidate["output"] == "Refund on SO-1 done."
    # The replays are the evaluation's: not the owner's usage, their cost its spend.
    replays = Session.objects.filter(evaluation_id=evaluation.pk)
    assert replays.count() == 2
    assert {s.owner.username for s in replays} == {services.EVALUATIONS_USER}
    assert all(s.workflow_version_id == runs[0].workflow_version_id for s in replays)
    after = sum(UsageDaily.objects.filter(owner=owner).values_list("model_calls", flat=True))
    assert after == usage
    assert evaluation.spent == sum((s.cost for s in replays), Decimal(0)) > 0
    report = selectors.evaluation_report(evaluation)
    assert report["turns"][0]["baseline"]["path"]
    # The workflow's figures count its own runs, not the evaluation's replays.
    figures = workflows_with_run_figures(Workflow.objects.filter(slug=slug)).get()
    assert figures.run_count == 2


def test_a_version_that_notifies_someone_else_shows_the_divergence_and_sends_nothing(
    flow: Callable[..., str], openai_server: FakeModelServer
) -> None:
    slug = flow()
    owner, runs = _recorded_runs(slug, openai_server)
    # Version 2: the card says it otherwise (the recorded decision still answers it, by
    # node), and the notice goes to customer 8.
    flow(customer="order.customer_id + 1", summary="Pay back")
    RAN.clear()
    openai_server.script(Reply(text="Refund on SO-2 done."))

    evaluation = _evaluate(owner, slug, f"{slug}@2")

    assert Counter() == RAN  # the notice to customer 8 was never sent; no lookup ran
    first, second = selectors.evaluation_turns(evaluation)  # the one that differs first
    assert first.session_id == runs[1].pk
    assert not first.trajectory_match and not first.outcome_match
    assert first.baseline["path"] == ["lookup", "check", "review", "notify", "tell"]
    assert first.candidate["path"] == ["lookup", "check", "review", "notify"]
    assert (first.baseline["outcome"], first.candidate["outcome"]) == ("finished", "failed")
    assert first.candidate["would_have_called"] == [
        {"tool": "eval_notify", "arguments": {"customer": 8}}
    ]
    call = ToolCall.objects.get(session_id=first.replay_id, tool_name="eval_notify")
    assert (call.status, call.refusal) == ("rejected", "not_sent")
    assert second.trajectory_match and second.outcome_match and second.answer_exact
    assert evaluation.totals["trajectory_match"] == 0.5
    assert evaluation.totals["would_have_called"] == 1


@pytest.mark.parametrize(
    ("value", "code"),
    [("nope", "invalid_input"), ("no-such-flow@1", "unknown_workflow_version")],
)
def test_a_bad_workflow_version_is_refused_naming_it(
    flow: Callable[..., str], openai_server: FakeModelServer, value: str, code: str
) -> None:
    slug = flow()
    owner, runs = _recorded_runs(slug, openai_server)
    with pytest.raises(InvalidInput) as refused:
        services.evaluation_create(
            owner=owner, actor="api:test", sessions=runs, candidate={"workflow_version": value}
        )
    assert refused.value.code == code
    assert refused.value.details["field"] == "candidate.workflow_version"
    # A conversation is no run of the workflow.
    with pytest.raises(InvalidInput) as refused:
        services.evaluation_create(
            owner=owner,
            actor="api:test",
            sessions=[SessionFactory(owner=owner)],
            candidate={"workflow_version": f"{slug}@1"},
        )
    assert refused.value.code == "not_runs_of_workflow"
    assert not Evaluation.objects.exists()


def test_only_runs_of_the_candidates_workflow_are_picked(
    flow: Callable[..., str], openai_server: FakeModelServer
) -> None:
    slug = flow()
    owner, runs = _recorded_runs(slug, openai_server)
    assert {s.pk for s in selectors.sessions_pick(owner_id=owner.pk, workflow=slug)} == {
        r.pk for r in runs
    }
    assert selectors.sessions_pick(owner_id=owner.pk) == []  # conversations only
    failed = selectors.SessionFilter(outcome="failed")
    assert selectors.sessions_pick(owner_id=owner.pk, workflow=slug, where=failed) == []
    with pytest.raises(InvalidInput):
        selectors.sessions_pick(
            owner_id=owner.pk, workflow=slug, where=selectors.SessionFilter(outcome="ok")
        )


def test_an_operator_evaluates_a_workflow_version_in_the_admin_and_reads_the_paths(
    flow: Callable[..., str], openai_server: FakeModelServer, client: Client
) -> None:
    slug = flow()
    owner, runs = _recorded_runs(slug, openai_server)
    flow(customer="order.customer_id + 1")
    operator = get_user_model().objects.create_superuser("operator", "op@example.com", "pw")
    client.force_login(operator)
    add = reverse("admin:evaluations_evaluation_add")
    version = WorkflowVersion.objects.get(workflow__slug=slug, number=2)
    response = client.post(add, {"candidate_workflow_version": version.pk, "outcome": "finished"})
    assert response.status_code == 302, response.content.decode()[-3000:]
    evaluation = Evaluation.objects.get()
    assert evaluation.candidate == {"workflow_version": f"{slug}@2"} and evaluation.total == 2
    assert set(evaluation.sessions.values_list("pk", flat=True)) == {r.pk for r in runs}
    openai_server.script(Reply(text="Refund on SO-2 done."))
    assert services.evaluation_run(evaluation_id=evaluation.pk) == "finished"

    html = client.get(
        reverse("admin:evaluations_evaluation_change", args=[evaluation.pk])
    ).content.decode()
    assert html.index("differs") < html.index("same")
    assert "path: <code>lookup → check → review → notify</code>" in html
    assert "eval_notify({&quot;customer&quot;: 8})" in html
    assert Counter(lookup=2, notify=1) == RAN  # only the recording's: the replay sent nothing


def test_over_rest_a_key_evaluates_only_its_owners_runs_and_bad_input_is_a_400(
    flow: Callable[..., str], openai_server: FakeModelServer
) -> None:
    slug = flow()
    owner, runs = _recorded_runs(slug, openai_server)
    mine = Api(api_key_for(owner.username))
    stranger = Api(api_key_for("stranger"))
    candidate = {"workflow_version": f"{slug}@1"}

    # Another owner's run is not found, as a missing one; a conversation is no run.
    assert_error(
        stranger.post(URL, {"sessions": [str(runs[0].pk)], "candidate": candidate}),
        404,
        "session_not_found",
    )
    conversation = SessionFactory(owner=owner)
    assert_error(
        mine.post(URL, {"sessions": [str(conversation.pk)], "candidate": candidate}),
        404,
        "session_not_found",
    )
    assert_error(
        mine.post(URL, {"filter": {"outcome": "ok"}, "candidate": candidate}),
        400,
        "invalid_input",
    )
    assert_error(
        mine.post(URL, {"filter": {}, "candidate": {"workflow_version": f"{slug}@9"}}),
        400,
        "unknown_workflow_version",
    )
    assert not Evaluation.objects.exists()

    created = mine.post(URL, {"filter": {"outcome": "finished"}, "candidate": candidate})
    assert created.status_code == 201, created.content
    assert created.json()["progress"] == {"done": 0, "total": 2}
    openai_server.script(Reply(text="Refund on SO-2 done."), Reply(text="Refund on SO-1 done."))
    services.evaluation_run(evaluation_id=created.json()["id"])  # what the worker's task does
    report = mine.get(f"{URL}{created.json()['id']}/").json()
    assert report["state"] == "finished" and report["candidate"] == candidate
    assert {tuple(t["candidate"]["path"]) for t in report["turns"]} == {
        ("lookup", "check", "tell"),
        ("lookup", "check", "review", "notify", "tell"),
    }
    assert all(t["baseline"]["output"] == t["candidate"]["output"] for t in report["turns"])
