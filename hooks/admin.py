"""Schedules (next fire times, their last fires; every change audited) and run webhooks'
deliveries (sent, failing, attempts, last error) in the admin."""

import json
from typing import Any

from django import forms
from django.contrib import admin
from django.db.models import Prefetch, QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.text import Truncator

from accounts.admin_access import (
    MESSAGE_CONTENT,
    ContentMaskedAdmin,
    ViewableLinksAdmin,
    masked,
)
from accounts.tenancy import TenantScopedAdmin
from audit.edits import AuditedAdmin

from .models import Schedule, ScheduleFire, WebhookDelivery
from .selectors import schedule_next_times
from .services import schedule_next_due, schedule_problems

# A change to any of these moves the next due time on from now.
TIMING = frozenset({"cron", "timezone", "enabled"})


class ScheduleForm(forms.ModelForm):
    class Meta:
        model = Schedule
        fields = [
            "name",
            "enabled",
            "cron",
            "timezone",
            "workflow",
            "input",
            "agent",
            "message",
            "owner",
            "api_key",
            "overlap",
            "webhook_url",
        ]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        problems = schedule_problems(
            cron=data.get("cron") or "",
            zone=data.get("timezone") or "",
            workflow=data.get("workflow") or "",
            agent=data.get("agent") or "",
            message=data.get("message") or "",
            webhook_url=data.get("webhook_url") or "",
        )
        key, owner = data.get("api_key"), data.get("owner")
        if key is not None and owner is not None and key.owner_id != owner.pk:
            problems["api_key"] = "a key of the schedule's owner"
        for field, problem in problems.items():
            self.add_error("webhook_url" if field == "webhook" else field, problem)
        return data


SESSION = "agent_sessions.session"


@admin.display(description="session")
def _session_text(model_admin: Any, obj: Any) -> str:
    """The session's id as text, for who may not open its page."""
    return str(obj.session_id) if obj.session_id else "-"


class FireInline(ViewableLinksAdmin, admin.TabularInline):
    model = ScheduleFire
    extra = 0
    can_delete = False
    fields = ("due", "status", "session", "delivery", "error", "created_at")
    readonly_fields = fields
    ordering = ("-due",)
    max_num = 0
    verbose_name_plural = "fires (newest first)"
    link_fields = {
        "session": (SESSION, "session_text"),
        "delivery": ("hooks.webhookdelivery", "delivery_text"),
    }
    session_text = _session_text

    def get_queryset(self, request: HttpRequest) -> QuerySet[ScheduleFire]:
        return super().get_queryset(request).select_related("session")

    @admin.display(description="webhook")
    def delivery(self, obj: ScheduleFire) -> SafeString | str:
        """The run's webhook deliveries (schedule → run → delivery), each linked."""
        if obj.session_id is None:
            return "-"
        return (
            format_html_join(
                " ",
                '<a href="{}">{}</a>',
                (
                    (reverse("admin:hooks_webhookdelivery_change", args=[d.pk]), d.status)
                    for d in WebhookDelivery.objects.filter(session_id=obj.session_id)[:5]
                ),
            )
            or "-"
        )

    @admin.display(description="webhook")
    def delivery_text(self, obj: ScheduleFire) -> str:
        if obj.session_id is None:
            return "-"
        statuses = WebhookDelivery.objects.filter(session_id=obj.session_id).values_list(
            "status", flat=True
        )
        return " ".join(statuses[:5]) or "-"


@admin.register(Schedule)
class ScheduleAdmin(ViewableLinksAdmin, AuditedAdmin, TenantScopedAdmin, admin.ModelAdmin):
    form = ScheduleForm
    link_fields = {"last_fire": (SESSION, "last_fire_text")}
    list_display = (
        "name",
        "what",
        "cron",
        "timezone",
        "overlap",
        "enabled",
        "next_times",
        "last_fire",
    )
    list_filter = ("enabled", "overlap")
    search_fields = ("name", "workflow", "agent")
    readonly_fields = ("next_times",)
    raw_id_fields = ("owner", "api_key")
    inlines = [FireInline]

    @admin.display(description="starts")
    def what(self, obj: Schedule) -> str:
        return f"workflow {obj.workflow}" if obj.workflow else f"agent {obj.agent}"

    @admin.display(description="next fire times")
    def next_times(self, obj: Schedule) -> SafeString | str:
        if not obj.pk or not obj.enabled:
            return "-"
        return format_html_join(
            "",
            '<div style="white-space: nowrap">{}</div>',
            ((t.strftime("%Y-%m-%d %H:%M %Z"),) for t in schedule_next_times(schedule=obj)),
        )

    def get_queryset(self, request: HttpRequest) -> QuerySet[Schedule]:
        # The list's "last fire": every schedule's newest fire in one query (a window per
        # schedule over schedule_fire_once), not one query per row.
        return (
            super()
            .get_queryset(request)
            .prefetch_related(
                Prefetch(
                    "fires",
                    queryset=ScheduleFire.objects.order_by("-due")[:1],
                    to_attr="newest_fires",
                )
            )
        )

    @staticmethod
    def _newest_fire(obj: Schedule) -> ScheduleFire | None:
        fires = getattr(obj, "newest_fires", None)
        if fires is None:  # a row not from get_queryset (a fresh save)
            return obj.fires.order_by("-due").first()
        return fires[0] if fires else None

    @admin.display(description="last fire")
    def last_fire(self, obj: Schedule) -> SafeString | str:
        """The newest fire's outcome, linked to the run it started (schedule → run)."""
        fire = self._newest_fire(obj)
        if fire is None:
            return "-"
        if fire.session_id is None:
            return format_html("{}: {}", fire.get_status_display(), Truncator(fire.error).chars(60))
        url = reverse("admin:agent_sessions_session_change", args=[fire.session_id])
        return format_html('{} <a href="{}">{}</a>', fire.status, url, str(fire.session_id)[:8])

    @admin.display(description="last fire")
    def last_fire_text(self, obj: Schedule) -> SafeString | str:
        """The same, for who may not open the session's page: its id as text."""
        fire = self._newest_fire(obj)
        if fire is None:
            return "-"
        if fire.session_id is None:
            return format_html("{}: {}", fire.get_status_display(), Truncator(fire.error).chars(60))
        return f"{fire.status} {str(fire.session_id)[:8]}"

    def save_audited(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        if not change or TIMING & set(form.changed_data) or obj.next_due_at is None:
            obj.next_due_at = schedule_next_due(schedule=obj) if obj.enabled else None
        super().save_audited(request, obj, form, change)


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(
    ViewableLinksAdmin, ContentMaskedAdmin, AuditedAdmin, TenantScopedAdmin, admin.ModelAdmin
):
    """Read-only; a delivery deleted by hand (its webhook is then never sent) is audited."""

    link_fields = {
        "session": (SESSION, "session_text"),
        "schedule": ("hooks.schedule", "schedule_text"),
    }
    session_text = _session_text

    tenant_owner_path = "session__owner"
    audit_withheld = frozenset({"finished"})
    # The body sent: the turn's outcome and a run's result, what the session said.
    content_permission = MESSAGE_CONTENT
    content_fields = {"finished_pretty": "finished_masked"}
    finished_masked = masked("finished", MESSAGE_CONTENT)
    # The URL and the error are long: shortened here (whole on the delivery's page), so
    # that the status and attempts stay on screen.
    list_display = (
        "__str__",
        "status",
        "attempts",
        "error_short",
        "next_attempt_at",
        "sent_at",
        "url_short",
    )
    list_filter = ("status",)
    search_fields = ("=session__id", "url")
    fields = (
        "session",
        "schedule",
        "turn",
        "status",
        "attempts",
        "next_attempt_at",
        "claimed_until",
        "sent_at",
        "created_at",
        "url",
        "last_error",
        "finished_pretty",
    )
    readonly_fields = fields

    @admin.display(description="url")
    def url_short(self, obj: WebhookDelivery) -> SafeString:
        return format_html(
            '<span title="{}" style="overflow-wrap: anywhere">{}</span>',
            obj.url,
            Truncator(obj.url).chars(48),
        )

    @admin.display(description="last error")
    def error_short(self, obj: WebhookDelivery) -> SafeString:
        return format_html(
            '<span title="{}">{}</span>', obj.last_error, Truncator(obj.last_error).chars(80)
        )

    @admin.display(description="schedule")
    def schedule(self, obj: WebhookDelivery) -> SafeString | str:
        """The schedule whose fire started this run, if one did (delivery → schedule)."""
        fire = ScheduleFire.objects.filter(session_id=obj.session_id).select_related("schedule")
        found = fire.first()
        if found is None:
            return "-"
        url = reverse("admin:hooks_schedule_change", args=[found.schedule_id])
        return format_html('<a href="{}">{}</a>', url, found.schedule.name)

    @admin.display(description="schedule")
    def schedule_text(self, obj: WebhookDelivery) -> str:
        found = ScheduleFire.objects.filter(session_id=obj.session_id).select_related("schedule")
        fire = found.first()
        return "-" if fire is None else fire.schedule.name

    @admin.display(description="finished (the payload sent)")
    def finished_pretty(self, obj: WebhookDelivery) -> SafeString:
        text = json.dumps(obj.finished, indent=2, ensure_ascii=False, sort_keys=True)
        return format_html('<pre class="ap-json">{}</pre>', text)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
