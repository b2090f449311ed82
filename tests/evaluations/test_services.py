"""Evaluations by replay on the real stack (PostgreSQL, Redis, the engine in-process, the
strict fake OpenAI-compatible server, a real HTTP business API): the baseline replayed
against itself scores identical; a candidate that calls another tool shows exactly that
divergence and sends nothing; the replays count in nobody's usage.

`transaction=True`: tools run on helper threads with their own database connections.
"""

from collections.abc import Callable
from decimal import Decimal

import pytest

from billing.models import UsageDaily
from evaluations import selectors, services
from evaluations.models import Evaluation, EvaluationTransition
from record.errors import InvalidInput
from record.models import ModelEndpoint, Session, ToolCall
from tests.fakes.model_servers import Call, FakeModelServer, Reply
from tests.tools.http_server import ScriptedApi

from .conftest import recorded_script

pytestmark = pytest.mark.django_db(transaction=True)


def _evaluate(session: Session, candidate: dict[str, str], **fields: object) -> Evaluation:
    evaluation = services.evaluation_create(
        owner=session.owner,
        actor="api:test",
        sessions=selectors.sessions_pick(owner_id=session.owner_id, ids=[str(session.pk)]),
        candidate=candidate,
        **fields,  # type: ignore[arg-type]
    )
    assert services.evaluation_run(evaluation_id=evaluation.pk) == "finished"
    evaluation.refresh_from_db()
    return evaluation


def test_the_baseline_replayed_against_itself_scores_identical_and_sends_nothing(
    recorded: Session, openai_server: FakeModelServer, business_api: ScriptedApi
):
    sent_before = len(business_api.requests)
    openai_server.script(Reply(text="Hello! How can I help?"), *recorded_script())

    evaluation = _evaluate(recorded, {"model": recorded.agent.model.name})

    assert evaluation.done == evaluation.total == 2
    totals = evaluation.totals
    assert totals["turns"] == 2
    for share in ("trajectory_match", "outcome_match", "answer_exact", "answer_similarity"):
        assert totals[share] == 1.0, (share, totals)
    assert totals["cost_ratio"] == 1.0
    assert totals["tokens_ratio"] == 1.0
    assert totals["would_have_called"] == 0
    # The coupon's result came from the record: the business API saw no second request.
    assert len(business_api.requests) == sent_before
    refund = next(t for t in evaluation.turns.all() if t.turn == 2)
    assert [c["tool"] for c in refund.candidate["calls"]] == ["get_order", "issue_coupon"]
    assert refund.candidate["answer"] == "I issued a coupon of 10 for order SO-1001."
    # The replayed turn started from the record's history: the greeting was in its request.
    replayed_request = openai_server.requests[-3]
    assert [m["content"] for m in replayed_request.messages if m["role"] == "user"][:2] == [
        "hi",
        "my order SO-1001 came late, please compensate me",
    ]
    assert list(
        EvaluationTransition.objects.filter(evaluation=evaluation)
        .values_list("to_state", flat=True)
        .order_by("id")
    ) == ["running", "finished"]


def test_a_candidate_calling_another_tool_shows_that_divergence_and_the_call_is_never_sent(
    recorded: Session,
    openai_server: FakeModelServer,
    business_api: ScriptedApi,
    endpoint_on: Callable[[str], ModelEndpoint],
):
    sent_before = len(business_api.requests)
    candidate = endpoint_on("candidate")
    openai_server.script(
        Reply(text="Hello! How can I help?"),
        Reply(calls=[Call("get_order", {"number": "SO-1001"})]),
        Reply(calls=[Call("cancel_order", {"number": "SO-1001"})]),
        Reply(text="I cancelled order SO-1001."),
    )

    evaluation = _evaluate(recorded, {"model": candidate.name})

    assert len(business_api.requests) == sent_before  # nothing reached the business API
    first, *rest = selectors.evaluation_turns(evaluation)  # the turns that differ first
    assert first.turn == 2 and not first.trajectory_match
    assert [(c["tool"], c["arguments"]) for c in first.baseline["calls"]] == [
        ("get_order", {"number": "SO-1001"}),
        ("issue_coupon", {"customer_id": 7, "amount": 10}),
    ]
    assert [(c["tool"], c["arguments"]) for c in first.candidate["calls"]] == [
        ("get_order", {"number": "SO-1001"}),
        ("cancel_order", {"number": "SO-1001"}),
    ]
    assert first.candidate["would_have_called"] == [
        {"tool": "cancel_order", "arguments": {"number": "SO-1001"}}
    ]
    assert not first.answer_exact and first.answer_similarity < 1.0
    assert [t.trajectory_match for t in rest] == [True]
    assert evaluation.totals["trajectory_match"] == 0.5
    assert evaluation.totals["would_have_called"] == 1
    # The model was told the truth: the call was not sent.
    cancel_result = openai_server.requests[-1].tool_results()[-1]
    assert "Not sent" in str(cancel_result)
    replay_call = ToolCall.objects.get(session_id=first.replay_id, tool_name="cancel_order")
    assert (replay_call.status, replay_call.refusal) == ("rejected", "not_sent")


def test_the_replays_count_in_no_users_usage_and_are_charged_to_the_evaluation(
    recorded: Session, openai_server: FakeModelServer
):
    openai_server.script(Reply(text="Hello! How can I help?"), *recorded_script())
    before = list(
        UsageDaily.objects.filter(owner=recorded.owner).values_list("model_calls", flat=True)
    )

    evaluation = _evaluate(recorded, {"model": recorded.agent.model.name})

    after = list(
        UsageDaily.objects.filter(owner=recorded.owner).values_list("model_calls", flat=True)
    )
    assert sum(after) == sum(before)
    replays = Session.objects.filter(evaluation_id=evaluation.pk)
    assert replays.count() == 2
    assert {s.owner.username for s in replays} == {services.EVALUATIONS_USER}
    assert evaluation.spent == sum((s.cost for s in replays), Decimal(0)) > 0
    # The candidate agent is a disabled copy: nobody can open a session on it.
    assert evaluation.candidate_agent is not None and not evaluation.candidate_agent.enabled


def test_a_read_only_call_the_record_lacks_runs_only_when_the_evaluation_allows_it(
    recorded: Session, openai_server: FakeModelServer, business_api: ScriptedApi
):
    def script() -> None:
        openai_server.script(
            Reply(text="Hello! How can I help?"),
            Reply(calls=[Call("get_order", {"number": "SO-2002"})]),
            Reply(text="Order SO-2002 is fine."),
        )

    sent_before = len(business_api.requests)
    script()
    refused = _evaluate(recorded, {"system_prompt": "Be brief."})
    assert len(business_api.requests) == sent_before
    turn = next(t for t in refused.turns.all() if t.turn == 2)
    assert turn.candidate["calls"][0]["status"] == "rejected"

    script()
    allowed = _evaluate(recorded, {"system_prompt": "Be brief."}, allow_read_only_calls=True)
    assert [r.query for r in business_api.requests[sent_before:]] == [{"number": "SO-2002"}]
    turn = next(t for t in allowed.turns.all() if t.turn == 2)
    assert turn.candidate["calls"][0]["status"] == "success"
    assert turn.candidate.get("would_have_called") is None


def test_a_spent_budget_stops_the_evaluation_and_says_so(
    recorded: Session, openai_server: FakeModelServer
):
    openai_server.script(Reply(text="Hello! How can I help?"), *recorded_script())
    evaluation = services.evaluation_create(
        owner=recorded.owner,
        actor="api:test",
        sessions=[recorded],
        candidate={"model": recorded.agent.model.name},
        budget_cost=Decimal("0.000001"),
    )
    assert services.evaluation_run(evaluation_id=evaluation.pk) == "failed"
    evaluation.refresh_from_db()
    assert evaluation.done == 1 and "budget" in evaluation.error


@pytest.mark.parametrize(
    ("candidate", "code"),
    [
        ({"model": "no-such-endpoint"}, "unknown_model"),
        ({"system_prompt": ""}, "invalid_input"),
        ({"agent_version": 3}, "invalid_input"),
        ({"agent_version": "nobody@1"}, "unknown_agent_version"),
        ({"workflow_version": 3}, "invalid_input"),
        ({"model": "x", "system_prompt": "y"}, "invalid_input"),
        ("gpt", "invalid_input"),
        ({"temperature": 2}, "invalid_input"),
    ],
)
def test_a_bad_candidate_is_refused_naming_it(recorded: Session, candidate: object, code: str):
    with pytest.raises(InvalidInput) as refused:
        services.evaluation_create(
            owner=recorded.owner, actor="api:test", sessions=[recorded], candidate=candidate
        )
    assert refused.value.code == code
    assert not Evaluation.objects.exists()


def test_a_cancelled_evaluation_does_not_run(recorded: Session):
    evaluation = services.evaluation_create(
        owner=recorded.owner,
        actor="api:test",
        sessions=[recorded],
        candidate={"system_prompt": "x"},
    )
    services.evaluation_cancel(evaluation=evaluation, actor="api:test")
    assert services.evaluation_run(evaluation_id=evaluation.pk) == "cancelled"
    assert not Session.objects.filter(evaluation_id=evaluation.pk).exists()
    with pytest.raises(services.IllegalMove):
        services.evaluation_cancel(evaluation=evaluation, actor="api:test")


def test_a_judge_model_scores_each_answer_by_the_operators_rubric(
    recorded: Session,
    openai_server: FakeModelServer,
    endpoint_on: Callable[[str], ModelEndpoint],
):
    judge = endpoint_on("judge")
    openai_server.script(
        Reply(text="Hello! How can I help?"),
        Reply(text='{"score": 1.0, "reason": "the same greeting"}'),
        *recorded_script(),
        Reply(text='{"score": 0.75, "reason": "fine"}'),
    )
    evaluation = _evaluate(
        recorded,
        {"model": recorded.agent.model.name},
        judge={"model": judge.name, "rubric": "Is the customer compensated?"},
    )
    assert sorted(t.judge_score for t in evaluation.turns.all()) == [0.75, 1.0]
    assert evaluation.totals["judge_score"] == 0.875
    asked = openai_server.requests[-1]
    assert "Is the customer compensated?" in asked.text()
    assert "I issued a coupon of 10 for order SO-1001." in asked.text()
