"""GET /metrics: Prometheus text format, for a scraper holding METRICS_TOKEN or on an internal address.

With `METRICS_TOKEN` set, a request must send `Authorization: Bearer <token>`.
Without it, only clients in `METRICS_ALLOWED_NETWORKS` (default loopback) are
served. Anyone else gets a 404 in the API's error shape, so the endpoint does
not announce itself.
"""

import os
from functools import lru_cache

from django.http import HttpRequest, HttpResponse, JsonResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client import multiprocess as prometheus_multiprocess
from prometheus_client.registry import REGISTRY

from .access import scraper_allowed
from .collector import ScrapeTimeCollector


@lru_cache(maxsize=1)
def _registry() -> CollectorRegistry:
    """Every process's samples (multiprocess mode) or this one's, plus the scrape-time gauges."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        prometheus_multiprocess.MultiProcessCollector(registry)
    else:
        registry = CollectorRegistry()
        # This process's own metrics (the observability.metrics module registers there).
        registry.register(_Delegate())
    registry.register(ScrapeTimeCollector())
    return registry


class _Delegate:
    """The default registry's collectors, inside our registry."""

    def collect(self):  # type: ignore[no-untyped-def]
        yield from REGISTRY.collect()


def allowed(request: HttpRequest) -> bool:
    return scraper_allowed(
        authorization=request.headers.get("Authorization", ""),
        address=request.META.get("REMOTE_ADDR", ""),
    )


def metrics(request: HttpRequest) -> HttpResponse:
    if request.method != "GET" or not allowed(request):
        return JsonResponse(
            {"error": {"code": "not_found", "message": "Not found.", "details": {}}}, status=404
        )
    return HttpResponse(generate_latest(_registry()), content_type=CONTENT_TYPE_LATEST)
