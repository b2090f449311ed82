"""An evaluation end to end: daphne + a Celery worker + beat. The demo request is recorded on
the strict fake OpenAI-compatible server (query_orders, notifications, the report); an app's
key asks over REST for an evaluation of that session on a scripted candidate that skips the
notifications and writes the report at once; the worker's task replays it and the report
shows exactly that divergence, and nothing was sent: no notification, no report."""

import os
import signal
import time
import uuid
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest

from demo.models import Notification, Report
from evaluations.models import Evaluation, EvaluationTransition, EvaluationTurn
from record.models import Agent, AgentVersion, ModelEndpoint, Session
from tests.demo_setup import DEMO_REQUEST, demo_install
from tests.e2e.support import api, create_session, post_message, set_model_options, stack_logs
from tests.e2e.test_adapters_e2e import demo_script
from tests.factories import api_key_for
from tests.fakes.fixtures import fake_servers  # noqa: F401 - the servers, started once per run
from tests.fakes.model_servers import Call, FakeServers, Recorded, Reply
from tests.stack import running_stack

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def fakes(fake_servers: FakeServers) -> Iterator[FakeServers]:  # noqa: F811
    fake_servers.reset()
    yield fake_servers
    errors = fake_servers.openai.errors
    violations = fake_servers.openai.violations
    fake_servers.reset()
    assert not errors, errors
    assert not violations, violations


def _endpoint(base_url: str) -> ModelEndpoint:
    return ModelEndpoint.objects.create(
        name=f"e2e-eval-{uuid.uuid4().hex[:8]}",
        api="openai",
        base_url=base_url,
        model="fake-openai",
        first_token_timeout_s=5,
        total_timeout_s=20,
    )


def _until(check: Any, what: str, timeout_s: float = 90.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_an_evaluation_over_rest_shows_the_candidates_divergence_and_sends_nothing(
    live_stack: Any, fakes: FakeServers
) -> None:
    demo_install()
    Agent.objects.filter(slug="order-support").update(model=_endpoint(fakes.openai.base_url))
    fakes.openai.script(*demo_script("openai"))
    key = api_key_for("eval-app")
    with api(live_stack, key) as client:
        session_id = create_session(client, "order-support")
        post_message(client, session_id, DEMO_REQUEST)
        _until(
            lambda: Session.objects.filter(pk=session_id, last_turn_number=1).exists(),
            "the recorded turn",
        )
        notified, reports = Notification.objects.count(), Report.objects.count()
        assert notified > 0 and reports == 1

        candidate = _endpoint(fakes.openai.base_url)
        lines = ["everything is late"]

        def report_at_once(request: Recorded) -> Reply:
            return Reply(calls=[Call("generate_report", {"title": "Exceptions", "lines": lines})])

        fakes.openai.script(
            demo_script("openai")[0],  # the same query_orders call: its result from the record
            report_at_once,
            Reply(text="I wrote the report."),
        )
        created = client.post(
            "/api/v1/evaluations/",
            json={"sessions": [session_id], "candidate": {"model": candidate.name}},
        )
        assert created.status_code == 201, created.text
        url = f"/api/v1/evaluations/{created.json()['id']}/"
        report = _until(
            lambda: (r := client.get(url).json())["state"] in ("finished", "failed") and r,
            "the evaluation",
        )
    assert report["state"] == "finished", report
    assert report["progress"] == {"done": 1, "total": 1}
    (turn,) = report["turns"]
    assert turn["trajectory_match"] is False
    baseline = [c["tool"] for c in turn["baseline"]["calls"]]
    assert baseline[0] == "query_orders" and baseline[-1] == "generate_report"
    assert "send_notification" in baseline
    assert turn["candidate"]["calls"] == [
        turn["baseline"]["calls"][0],
        {"tool": "generate_report", "arguments": {"title": "Exceptions", "lines": lines}},
    ]
    assert turn["candidate"]["would_have_called"] == [
        {"tool": "generate_report", "arguments": {"title": "Exceptions", "lines": lines}}
    ]
    assert turn["candidate"]["answer"] == "I wrote the report."
    assert report["totals"]["trajectory_match"] == 0.0
    assert report["totals"]["would_have_called"] == 1
    # Nothing was sent: no notification, no second report.
    assert (Notification.objects.count(), Report.objects.count()) == (notified, reports)


def test_an_evaluation_whose_worker_is_killed_is_finished_by_another_scoring_each_turn_once() -> (
    None
):
    """A real Celery worker SIGKILLed in the middle of an evaluation (its first replay
    running on the slowed rules model): its lease lapses, beat's sweep sends the task
    again, a second worker resumes on the replay the dead one opened and finishes; each
    turn is scored once, the cost charged once, nothing sent. The candidate is the agent's
    own configuration version, so the scores are identical."""

    demo_install()
    (version,) = AgentVersion.objects.filter(agent__slug="order-support")
    key = api_key_for("eval-crash")
    extra = {
        "SESSION_LEASE_S": "3",
        "EVALUATION_LEASE_S": "3",
        "EVALUATIONS_SWEEP_S": "1",
        "CELERY_QUEUE": f"agentplatform-eval-crash-{os.getpid()}",
    }
    with running_stack(extra_env=extra) as stack, api(stack, key) as client:
        logs = stack_logs(stack, "worker", "worker2", "beat")
        recorded = []
        for _ in range(2):
            session_id = create_session(client, "order-support")
            post_message(client, session_id, DEMO_REQUEST)
            recorded.append(session_id)
        _until(
            lambda: Session.objects.filter(pk__in=recorded, last_turn_number=1).count() == 2,
            "the recorded turns",
        )
        notified, reports = Notification.objects.count(), Report.objects.count()
        set_model_options("rules", latency_s=1.0)  # each replayed model call takes a second

        created = client.post(
            "/api/v1/evaluations/",
            json={
                "sessions": recorded,
                "candidate": {"agent_version": f"order-support@{version.number}"},
            },
        )
        assert created.status_code == 201, created.text
        evaluation_id = created.json()["id"]
        victim = stack.procs["worker"]
        _until(
            lambda: (
                Session.objects.filter(evaluation_id=evaluation_id).exists()
                and f":{victim.pid}:" in Evaluation.objects.get(pk=evaluation_id).lease_owner
            ),
            f"the first replay under the first worker\n{logs()}",
            timeout_s=60,
        )
        stack.stop("worker", signal.SIGKILL)
        assert victim.poll() == -signal.SIGKILL
        assert EvaluationTurn.objects.filter(evaluation_id=evaluation_id).count() == 0
        stack.start_worker("worker2")
        url = f"/api/v1/evaluations/{evaluation_id}/"
        report = _until(
            lambda: (r := client.get(url).json())["state"] in ("finished", "failed") and r,
            f"the evaluation finished by the second worker\n{logs()}",
            timeout_s=120,
        )
    assert report["state"] == "finished", report
    assert report["progress"] == {"done": 2, "total": 2}
    evaluation = Evaluation.objects.get(pk=evaluation_id)
    assert evaluation.resumes >= 1
    assert EvaluationTransition.objects.filter(
        evaluation=evaluation, actor="sweeper", to_state="running"
    ).exists()
    # Each turn scored once, on one replay each: the second worker took the dead one's.
    turns = list(EvaluationTurn.objects.filter(evaluation=evaluation))
    assert sorted((str(t.session_id), t.turn) for t in turns) == sorted((s, 1) for s in recorded)
    assert Session.objects.filter(evaluation_id=evaluation_id).count() == 2
    costs = sum((Decimal(t.candidate["cost"]) for t in turns), Decimal(0))
    assert evaluation.spent == costs and costs > 0
    for share in ("trajectory_match", "outcome_match", "answer_exact"):
        assert report["totals"][share] == 1.0, (share, report["totals"])
    # Nothing was sent by either worker's replays.
    assert (Notification.objects.count(), Report.objects.count()) == (notified, reports)
