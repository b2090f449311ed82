"""Celery tasks of evaluations: run one (by id) in the background; the sweeper's part
(beat) that sends again those whose worker died."""

from celery import shared_task

from .services import evaluation_run as run
from .services import evaluations_sweep as sweep


@shared_task(name="evaluations.tasks.evaluation_run", ignore_result=True)
def evaluation_run(evaluation_id: int) -> str:
    return run(evaluation_id=evaluation_id)


@shared_task(name="evaluations.tasks.evaluations_sweep", ignore_result=True)
def evaluations_sweep() -> int:
    return len(sweep())
