"""Gauges computed at scrape time from PostgreSQL and Redis (cheap queries, one scrape at a time).

Process-local gauges would be wrong with several processes and cost on the hot
path; these read the source of truth when Prometheus asks. Each source is a
function named in `settings.METRICS_SOURCES` returning `readings.Gauge`s; a
source that fails is reported as `agent_metrics_source_up{source} 0` and the
scrape goes on.
"""

import logging
import time
from collections.abc import Callable, Iterator
from functools import lru_cache

import redis
from django.conf import settings
from django.utils.module_loading import import_string
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from runtime import tasks

from .readings import Gauge

logger = logging.getLogger(__name__)

BREAKER_STATES = {"closed": 0, "half_open": 1, "open": 2}


@lru_cache(maxsize=1)
def _redis() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2)


def queue_gauges() -> list[Gauge]:
    """Runs waiting in the broker, per queue (all priorities together)."""
    queue = settings.CELERY_TASK_DEFAULT_QUEUE
    depth = tasks.queue_depth()
    return [
        Gauge(
            "agent_queue_depth",
            "Tasks waiting in the broker queue.",
            ("queue",),
            [((queue,), depth)],
        )
    ]


def breaker_gauges() -> list[Gauge]:
    """Each circuit breaker that has a record in Redis: 0 closed, 1 half-open (cool-down over), 2 open."""
    client = _redis()
    prefix = f"{settings.REDIS_KEY_PREFIX}:breaker:"
    keys = list(client.scan_iter(match=prefix + "*", count=500))
    now = time.time()
    samples: list[tuple[tuple[str, ...], float]] = []
    if keys:
        pipe = client.pipeline(transaction=False)
        for key in keys:
            pipe.hmget(key, ["open_until", "failures"])
        for key, (open_until, _failures) in zip(keys, pipe.execute(), strict=True):
            kind, _, name = key.decode()[len(prefix) :].partition(":")
            until = float(open_until or 0)
            state = "closed" if not until else ("open" if until > now else "half_open")
            samples.append(((kind, name), BREAKER_STATES[state]))
    return [
        Gauge(
            "agent_breaker_state",
            "Circuit breaker state by kind (model, tool) and name: 0 closed, 1 half-open, 2 open.",
            ("kind", "name"),
            samples,
        )
    ]


@lru_cache(maxsize=1)
def _sources() -> tuple[tuple[str, Callable[[], list[Gauge]]], ...]:
    named: list[tuple[str, Callable[[], list[Gauge]]]] = [
        ("queue", queue_gauges),
        ("breakers", breaker_gauges),
    ]
    named += [(path.rsplit(".", 1)[-1], import_string(path)) for path in settings.METRICS_SOURCES]
    return tuple(named)


class ScrapeTimeCollector(Collector):
    def collect(self) -> Iterator[GaugeMetricFamily]:
        up = GaugeMetricFamily(
            "agent_metrics_source_up", "Whether a scrape-time source answered.", labels=["source"]
        )
        for name, source in _sources():
            try:
                gauges = source()
            except Exception:  # noqa: BLE001 - one broken source must not hide the others
                logger.warning("metrics source %s failed", name, exc_info=True)
                up.add_metric([name], 0)
                continue
            up.add_metric([name], 1)
            for gauge in gauges:
                family = GaugeMetricFamily(gauge.name, gauge.help, labels=list(gauge.labels))
                for values, value in gauge.samples:
                    family.add_metric(list(values), value)
                yield family
        yield up
