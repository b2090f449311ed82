"""Celery tasks of schedules and run webhooks: they take ids and delegate."""

from typing import Any

from celery import shared_task

from . import services


@shared_task(name="hooks.tasks.schedules_fire", ignore_result=True)
def schedules_fire() -> int:
    return services.schedules_fire_due()


@shared_task(name="hooks.tasks.webhooks_sweep", ignore_result=True)
def webhooks_sweep() -> int:
    return services.webhooks_sweep()


@shared_task(name="hooks.tasks.webhook_deliver", ignore_result=True)
def webhook_deliver(delivery_id: int) -> Any:
    delivered = services.webhook_deliver(delivery_id=delivery_id)
    return None if delivered is None else delivered.status
