"""Celery wiring of observability: the worker's own metrics endpoint (loaded by task autodiscovery)."""

from typing import Any

from celery.signals import worker_ready
from django.conf import settings

from .worker_endpoint import metrics_endpoint_start


@worker_ready.connect
def metrics_endpoint(sender: Any = None, **_: Any) -> None:
    """With WORKER_METRICS_PORT set, this worker serves /metrics (observability/worker_endpoint.py)."""
    if settings.WORKER_METRICS_PORT:
        metrics_endpoint_start(bind=settings.WORKER_METRICS_BIND, port=settings.WORKER_METRICS_PORT)
