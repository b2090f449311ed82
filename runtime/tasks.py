"""Sending a Celery task by name: the one way every process hands work to a worker.

A process knows only the tasks whose modules it imported. The web process never imports
`approvals.tasks` or `memory.tasks`, so looking a task up in `current_app.tasks` there
raised NotRegistered and the message was lost (a probe saw 2 of 18 approval webhooks
delivered). The broker needs only the name; the worker, which imports every task module,
resolves it. Nothing here imports an app, so every layer may send.

The queue's depth is counted here too, by the broker's transport (kombu's `queue_declare`,
every priority list together), so that no module copies the transport's key layout.
"""

from typing import Any

from celery import current_app


def task_send(
    name: str,
    args: tuple[Any, ...] = (),
    *,
    priority: int | None = None,
    countdown: float | None = None,
    headers: dict[str, str] | None = None,
) -> None:
    """Publish task `name` with `args` on the default queue; broker errors propagate."""
    options: dict[str, Any] = {}
    if priority is not None:
        options["priority"] = priority
    if countdown is not None:
        options["countdown"] = countdown
    if headers:
        options["headers"] = headers
    current_app.send_task(name, args=args, **options)


def queue_depth() -> int:
    """Tasks waiting in the default queue; a broker out of reach raises kombu's
    OperationalError at once (no retries: callers read the depth on a step's path)."""
    with current_app.pool.acquire(block=True) as connection:
        connection.ensure_connection(max_retries=0, timeout=1)
        queue = current_app.conf.task_default_queue
        return int(connection.default_channel.queue_declare(queue=queue).message_count)
