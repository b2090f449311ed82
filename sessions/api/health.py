"""Liveness and readiness probes (outside /api/v1/, no authentication)."""

import time

import redis
from celery import current_app
from django.conf import settings
from django.db import connection
from django.http import HttpRequest, JsonResponse

from sessions.sweep_status import sweep_age_s


def healthz(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "ok"})


def _check_database() -> str | None:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return None
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}"


def _check_redis() -> str | None:
    try:
        client = redis.Redis.from_url(
            settings.REDIS_URL, socket_timeout=1, socket_connect_timeout=1
        )
        client.ping()
        client.close()
        return None
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}"


def _check_worker() -> str | None:
    try:
        replies = current_app.control.ping(timeout=1.0, limit=1)
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}"
    return None if replies else "no worker answered within 1 s"


def _check_sweeper() -> str | None:
    """Beat and the sweeper are alive: a sweep completed within SWEEPER_STALE_S."""
    try:
        age = sweep_age_s()
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}"
    limit = settings.SWEEPER_STALE_S
    if age is None:
        return f"no sweep has completed (is celery beat running?); limit {limit:g} s"
    if age > limit:
        return f"last sweep completed {age:.0f} s ago (limit {limit:g} s; is celery beat running?)"
    return None


def readyz(request: HttpRequest) -> JsonResponse:
    started = time.perf_counter()
    checks = {"database": _check_database(), "redis": _check_redis()}
    # Asking the broker for a worker needs the broker; skip it if Redis is down.
    checks["worker"] = _check_worker() if checks["redis"] is None else "redis unavailable"
    checks["sweeper"] = _check_sweeper() if checks["redis"] is None else "redis unavailable"
    ok = all(v is None for v in checks.values())
    body = {
        "status": "ok" if ok else "unavailable",
        "checks": {name: ("ok" if err is None else err) for name, err in checks.items()},
        "ms": round((time.perf_counter() - started) * 1000, 1),
    }
    return JsonResponse(body, status=200 if ok else 503)
