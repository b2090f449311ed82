"""Celery entry points: take ids, call one service."""

from celery import shared_task

from . import services


@shared_task(name="sessions.tasks.run_session", acks_late=True, reject_on_worker_lost=True)
def run_session(session_id: str) -> str:
    return services.session_run_pending(session_id=session_id).stopped


@shared_task(name="sessions.tasks.sweep_sessions", ignore_result=True)
def sweep_sessions() -> int:
    return len(services.sessions_sweep())


@shared_task(name="sessions.tasks.prune_checkpoints", ignore_result=True)
def prune_checkpoints() -> int:
    return services.checkpoints_prune()
