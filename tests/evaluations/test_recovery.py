"""An evaluation whose worker died: its lease lapses, the sweeper sends it again, the next
worker resumes after the last scored turn, reusing the replays the dead one opened: no
turn scored twice, no model call made twice, its cost charged once. A worker that lost
its lease writes nothing more.

(The real thing, a Celery worker SIGKILLed mid-evaluation: tests/e2e/test_evaluations_e2e.py.)
"""

from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone

from evaluations import lease, services
from evaluations.models import Evaluation, EvaluationTransition, EvaluationTurn
from record.models import Session
from tests.factories import EvaluationFactory
from tests.fakes.model_servers import FakeModelServer, Reply

from .conftest import recorded_script


class _Killed(BaseException):
    """The worker's process ending where it stands (no except Exception catches it)."""


def _ago(seconds: float) -> Any:
    return timezone.now() - timedelta(seconds=seconds)


@pytest.mark.django_db
def test_the_sweeper_sends_again_only_unfinished_evaluations_nobody_runs(
    django_capture_on_commit_callbacks: Any,
) -> None:
    lapsed = EvaluationFactory(state="running", lease_owner="dead:1", leased_until=_ago(1))
    live = EvaluationFactory(state="running", lease_owner="w:2", leased_until=_ago(-60))
    fresh = EvaluationFactory(state="queued")  # its task is on its way
    lost = EvaluationFactory(state="queued")
    Evaluation.objects.filter(pk=lost.pk).update(created_at=_ago(3600))
    ended = EvaluationFactory(state="finished", lease_owner="dead:3", leased_until=_ago(1))

    with django_capture_on_commit_callbacks() as sent:
        resumed = services.evaluations_sweep()

    assert sorted(resumed) == sorted([lapsed.pk, lost.pk])
    assert len(sent) == 2
    lapsed.refresh_from_db()
    assert lapsed.lease_owner == "" and lapsed.leased_until > timezone.now()
    assert lapsed.resumes == 1
    move = EvaluationTransition.objects.get(evaluation=lapsed)
    assert (move.from_state, move.to_state, move.actor) == ("running", "running", "sweeper")
    assert "dead:1" in move.reason
    # The pickup grace: the next sweep leaves them to the task just sent.
    assert services.evaluations_sweep() == []
    for row in (live, fresh, ended):
        before = (row.lease_owner, row.leased_until, row.resumes)
        row.refresh_from_db()
        assert (row.lease_owner, row.leased_until, row.resumes) == before
    # A worker of a live lease's evaluation does nothing: another runs it.
    assert services.evaluation_run(evaluation_id=live.pk) == "running"
    assert not EvaluationTransition.objects.filter(evaluation=live).exists()


@pytest.mark.django_db(transaction=True)
def test_a_dead_workers_evaluation_resumes_without_scoring_or_charging_twice(
    recorded: Session, openai_server: FakeModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The whole conversation once: the greeting, then the refund's three calls.
    asked = len(openai_server.requests)
    openai_server.script(Reply(text="Hello! How can I help?"), *recorded_script())
    evaluation = services.evaluation_create(
        owner=recorded.owner,
        actor="api:test",
        sessions=[recorded],
        candidate={"model": recorded.agent.model.name},
    )
    real_wait = services._replay_wait
    waits = 0

    def dies_in_the_second_turn(replay: Session, turn: int, *, timeout_s: float) -> None:
        nonlocal waits
        waits += 1
        if waits == 2:  # the refund's replay is open, its turn not run yet
            raise _Killed
        real_wait(replay, turn, timeout_s=timeout_s)

    monkeypatch.setattr(services, "_replay_wait", dies_in_the_second_turn)
    with pytest.raises(_Killed):
        services.evaluation_run(evaluation_id=evaluation.pk)
    monkeypatch.setattr(services, "_replay_wait", real_wait)
    evaluation.refresh_from_db()
    dead = evaluation.lease_owner
    assert evaluation.state == "running" and dead and evaluation.done == 0
    assert len(openai_server.requests) - asked == 1  # the greeting's replay ran, unscored
    # Not lapsed yet: nothing to resume.
    assert services.evaluations_sweep() == []
    Evaluation.objects.filter(pk=evaluation.pk).update(leased_until=_ago(1))

    assert services.evaluations_sweep() == [evaluation.pk]
    assert services.evaluation_run(evaluation_id=evaluation.pk) == "finished"

    evaluation.refresh_from_db()
    assert evaluation.done == evaluation.total == 2 and evaluation.resumes == 1
    assert evaluation.totals["trajectory_match"] == 1.0
    # Each turn scored once, on the replay the dead worker opened; no model call twice.
    turns = list(EvaluationTurn.objects.filter(evaluation=evaluation).order_by("turn"))
    assert [t.turn for t in turns] == [1, 2]
    assert Session.objects.filter(evaluation_id=evaluation.pk).count() == 2
    assert len(openai_server.requests) - asked == 4
    assert evaluation.spent == sum((Decimal(t.candidate["cost"]) for t in turns), Decimal(0))
    assert evaluation.spent > 0
    assert list(
        EvaluationTransition.objects.filter(evaluation=evaluation)
        .order_by("id")
        .values_list("to_state", "actor")
    ) == [("running", "system"), ("running", "sweeper"), ("finished", "system")]

    # The dead worker, had it only been slow, writes nothing more.
    with pytest.raises(lease.LeaseLost):
        services._turns_write(evaluation, [turns[0]], dead)
    evaluation.refresh_from_db()
    assert evaluation.done == 2 and evaluation.turns.count() == 2
