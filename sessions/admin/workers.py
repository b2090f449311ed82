"""Workers and their health: one row per live worker process, from its heartbeat in
Redis (runtime/health.py), with the thresholds it is judged by and the step pacing the
sweeper publishes. Read-only: a worker recovers by itself."""

from datetime import UTC, datetime
from typing import Any

import redis
from django.conf import settings
from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from record.models import WorkerHealth
from runtime import health


@admin.register(WorkerHealth)
class WorkerHealthAdmin(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        problem = ""
        reports: list[health.Report] = []
        pacing: health.Pacing | None = None
        try:
            reports = health.reports_read()
            pacing = health.pacing_read()
        except (redis.RedisError, ValueError, TypeError, KeyError) as exc:
            problem = f"Redis could not be read ({type(exc).__name__})"
        rows = [
            {
                "report": r,
                "seen": datetime.fromtimestamp(r.at, tz=UTC),
                "age_s": max(0.0, datetime.now(tz=UTC).timestamp() - r.at),
            }
            for r in reports
        ]
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": "Workers",
            "rows": rows,
            "unhealthy": sum(1 for r in reports if not r.accepting),
            "pacing": pacing,
            "problem": problem,
            "limits": health.Thresholds.from_settings(),
            "window_s": settings.WORKER_HEALTH_WINDOW_S,
            "heartbeat_s": settings.WORKER_HEARTBEAT_S,
            **(extra_context or {}),
        }
        return TemplateResponse(request, "admin/agent_sessions/workers.html", context)
