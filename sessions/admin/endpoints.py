"""Model endpoints (prices, keys, the circuit breaker) and the calls made to them."""

from datetime import UTC, datetime
from typing import Any

from django.contrib import admin
from django.db import models
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.html import format_html

from accounts.admin_access import holds
from accounts.tenancy import TenantScopedAdmin
from audit.edits import AuditedAdmin, breaker_reset_audit
from record.models import ModelCall, ModelEndpoint
from runtime.breaker import model_breaker
from tools.forms import JSON_FIELD, breaker_badge, optional_count_field

from .base import ReadOnlyAdmin
from .display import format_cost, short


@admin.register(ModelEndpoint)
class ModelEndpointAdmin(AuditedAdmin, admin.ModelAdmin):
    formfield_overrides = {models.URLField: {"assume_scheme": "https"}, **JSON_FIELD}
    list_display = (
        "name",
        "enabled",
        "breaker",
        "key_status",
        "api",
        "model",
        "prices",
        "window",
        "base_url_short",
        "updated",
    )
    list_filter = ("api", "enabled")
    search_fields = ("name", "model", "base_url")
    actions = ("reset_breaker",)

    def formfield_for_dbfield(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        return optional_count_field(db_field) or super().formfield_for_dbfield(
            db_field, request, **kwargs
        )

    @admin.display(description="breaker")
    def breaker(self, obj: ModelEndpoint) -> str:
        state = model_breaker().state(obj.name)
        if state.state == "closed":
            return breaker_badge(state.state, state.failures)
        until = datetime.fromtimestamp(state.open_until, tz=UTC).strftime("%H:%M:%S UTC")
        return breaker_badge(state.state, state.failures, until)

    @admin.display(description="price in / out per 1k", ordering="price_input_per_1k")
    def prices(self, obj: ModelEndpoint) -> str:
        return f"{format_cost(obj.price_input_per_1k)} / {format_cost(obj.price_output_per_1k)}"

    @admin.display(description="window", ordering="context_window")
    def window(self, obj: ModelEndpoint) -> str:
        return f"{obj.context_window:,}"

    @admin.display(description="base url", ordering="base_url")
    def base_url_short(self, obj: ModelEndpoint) -> str:
        return format_html('<span title="{}">{}</span>', obj.base_url, short(obj.base_url, 30))

    @admin.display(description="updated", ordering="updated_at")
    def updated(self, obj: ModelEndpoint) -> str:
        return timezone.localtime(obj.updated_at).strftime("%Y-%m-%d %H:%M:%S")

    @admin.display(description="API key")
    def key_status(self, obj: ModelEndpoint) -> str:
        # The endpoint is misconfigured: its calls are refused until the variable is set.
        # Compact in the list (the full sentence is the tooltip and on the change page).
        if obj.missing_key_env:
            return format_html(
                '<strong style="color:#dc2626" title="misconfigured: {} is not set">missing</strong>',
                obj.missing_key_env,
            )
        if obj.api_key_env:
            return format_html('<span title="from {}">set</span>', obj.api_key_env)
        return "none"

    def has_reset_breaker_permission(self, request: HttpRequest) -> bool:
        # A reset sends traffic to an endpoint the breaker judged down: not an edit of the row.
        return holds(request, "agent_sessions.reset_breaker_modelendpoint")

    @admin.action(description="Reset the circuit breaker", permissions=["reset_breaker"])
    def reset_breaker(self, request: HttpRequest, queryset: QuerySet[ModelEndpoint]) -> None:
        breaker = model_breaker()
        for endpoint in queryset:
            state = breaker.state(endpoint.name).state
            breaker.reset(endpoint.name)
            breaker_reset_audit(request, endpoint, state)
        self.message_user(request, f"Reset {queryset.count()} breaker(s).")

    readonly_fields = ("updated_at", "key_status")
    fieldsets = (
        (
            None,
            {
                "fields": (
                    "name",
                    "api",
                    "base_url",
                    "model",
                    "api_key_env",
                    "key_status",
                    "enabled",
                )
            },
        ),
        (
            "Timeouts and retries",
            {"fields": ("connect_timeout_s", "first_token_timeout_s", "total_timeout_s", "retry")},
        ),
        (
            "Prices and limits",
            {
                "fields": (
                    "price_input_per_1k",
                    "price_output_per_1k",
                    "credits_per_1k_tokens",
                    "context_window",
                    "tokenizer",
                    "tokenizer_ratio",
                )
            },
        ),
        (
            "Rate limits (per owner per minute, all workers; 0 = no limit)",
            {"fields": ("rate_limit_calls_per_min", "rate_limit_tokens_per_min")},
        ),
        ("Options", {"fields": ("options", "updated_at")}),
    )


@admin.register(ModelCall)
class ModelCallAdmin(TenantScopedAdmin, ReadOnlyAdmin):
    tenant_owner_path = "session__owner"
    list_display = (
        "id",
        "session_short",
        "outcome_display",
        "cost_display",
        "endpoint_name",
        "model",
        "turn",
        "tokens",
        "timing",
        "routing",
        "created",
    )
    list_filter = ("outcome", "purpose", "endpoint_name", "fallback_used", "rollout", "retried")
    search_fields = ("endpoint_name", "model", "error")
    ordering = ("-id",)
    fields = (
        "session_short",
        "turn",
        "step",
        "endpoint_name",
        "api",
        "model",
        "outcome",
        "error",
        "input_tokens",
        "output_tokens",
        "tokens_estimated",
        "first_token_ms",
        "total_ms",
        "retried",
        "fallback_used",
        "rollout",
        "purpose",
        "cost",
        "created_at",
    )
    readonly_fields = fields

    @admin.display(description="outcome", ordering="outcome")
    def outcome_display(self, obj: ModelCall) -> str:
        colour = "#15803d" if obj.outcome == "success" else "#dc2626"
        return format_html(
            '<span style="color:{};font-weight:600" title="{}">{}</span>',
            colour,
            short(obj.error, 300),
            obj.outcome.replace("_", " "),
        )

    @admin.display(description="cost", ordering="cost")
    def cost_display(self, obj: ModelCall) -> str:
        return format_cost(obj.cost)

    @admin.display(description="tokens in / out", ordering="input_tokens")
    def tokens(self, obj: ModelCall) -> str:
        return f"{obj.input_tokens} / {obj.output_tokens}" + ("*" if obj.tokens_estimated else "")

    @admin.display(description="first token / total", ordering="total_ms")
    def timing(self, obj: ModelCall) -> str:
        first = f"{obj.first_token_ms} ms" if obj.first_token_ms is not None else "—"
        return f"{first} / {obj.total_ms} ms"

    @admin.display(description="routing")
    def routing(self, obj: ModelCall) -> str:
        flags = [
            name
            for name, on in (
                ("retry", obj.retried),
                ("fallback", obj.fallback_used),
                ("rollout", obj.rollout),
            )
            if on
        ]
        if obj.purpose != "step":
            flags.append(obj.purpose)  # the engine's own calls: summary, dialogue
        return ", ".join(flags) or "—"

    @admin.display(description="at", ordering="created_at")
    def created(self, obj: ModelCall) -> str:
        return timezone.localtime(obj.created_at).strftime("%Y-%m-%d %H:%M:%S")
