"""Celery tasks of evaluations: run one (by id) in the background."""

from celery import shared_task

from .services import evaluation_run as run


@shared_task(name="evaluations.tasks.evaluation_run", ignore_result=True)
def evaluation_run(evaluation_id: int) -> str:
    return run(evaluation_id=evaluation_id)
