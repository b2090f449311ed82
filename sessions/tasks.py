"""Celery entry points: take ids, call one service."""

from celery import shared_task

from observability import tracing

from . import services


@shared_task(
    name="sessions.tasks.run_session", acks_late=True, reject_on_worker_lost=True, bind=True
)
def run_session(self, session_id: str) -> str:  # type: ignore[no-untyped-def]
    # The sender's trace context (a `traceparent` header) becomes this run's parent.
    with tracing.attached(self.request.get("traceparent")):
        return services.session_run_pending(session_id=session_id).stopped


@shared_task(name="sessions.tasks.sweep_sessions", ignore_result=True)
def sweep_sessions() -> int:
    return len(services.sessions_sweep())


@shared_task(name="sessions.tasks.prune_checkpoints", ignore_result=True)
def prune_checkpoints() -> int:
    return services.checkpoints_prune()


@shared_task(name="sessions.tasks.keep_turn_memory", ignore_result=True)
def keep_turn_memory(session_id: str, turn: int) -> int:
    return services.memory_turn_keep(session_id=session_id, turn=turn)
