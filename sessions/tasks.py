"""Celery entry points: take ids, call one service. Plus the worker's health heartbeat
(runtime/health.py), started when a worker is ready and stopped when it shuts down."""

from typing import Any

from celery import shared_task
from celery.signals import worker_ready, worker_shutdown
from django.conf import settings

from observability import tracing
from runtime import health

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
    return len(services.sessions_sweep_scheduled())


@shared_task(name="sessions.tasks.prune_checkpoints", ignore_result=True)
def prune_checkpoints() -> int:
    return services.checkpoints_prune()


@shared_task(name="sessions.tasks.prune_ephemeral_sessions", ignore_result=True)
def prune_ephemeral_sessions() -> int:
    return services.ephemeral_sessions_prune()


@shared_task(name="sessions.tasks.prune_request_keys", ignore_result=True)
def prune_request_keys() -> int:
    return services.request_keys_prune()


@shared_task(name="sessions.tasks.keep_turn_memory", ignore_result=True)
def keep_turn_memory(session_id: str, turn: int) -> int:
    return services.memory_turn_keep(session_id=session_id, turn=turn)


@shared_task(name="sessions.tasks.summarise_ahead", ignore_result=True)
def summarise_ahead(session_id: str) -> bool:
    return services.summary_ahead_run(session_id=session_id)


@worker_ready.connect
def health_start(sender: Any = None, **_: Any) -> None:
    """Start this worker's heartbeat. Over its thresholds the worker cancels its consumer
    of the run queue (a remote-control message to itself, carried out by the worker's
    own event loop, so no thread touches the consumer but its own) and adds it back
    once it recovers; messages it already prefetched are requeued by
    services.session_run_pending."""
    if sender is None or health.monitors:
        return
    app, hostname = sender.app, sender.hostname
    queue = settings.CELERY_TASK_DEFAULT_QUEUE

    def switch(accepting: bool) -> None:
        if accepting:
            app.control.add_consumer(queue, destination=[hostname], reply=False)
        else:
            app.control.cancel_consumer(queue, destination=[hostname], reply=False)

    monitor = health.Monitor(hostname, switch, interval_s=settings.WORKER_HEARTBEAT_S)
    health.monitors.append(monitor)
    monitor.start()


@worker_shutdown.connect
def health_stop(**_: Any) -> None:
    while health.monitors:
        health.monitors.pop().stop()
