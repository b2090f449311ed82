"""The operators' console: agents, models, sessions and their read-only history.

Operators read what the engine wrote; they never edit it. A session's state
only moves through the state machine, so the one thing an operator can do to
a run here is ask the service layer to cancel its turn.
"""

import json
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.postgres.aggregates import StringAgg
from django.core.exceptions import PermissionDenied
from django.db import models
from django.db.models import Count, QuerySet, Sum
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
)
from django.shortcuts import get_object_or_404
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.text import Truncator
from jsonschema import Draft202012Validator

from runtime.breaker import model_breaker
from tools.forms import JSON_FIELD
from tools.models import Tool

from . import services
from .config_schema import RULE
from .events import EventType
from .models import (
    Agent,
    Checkpoint,
    Event,
    Message,
    ModelCall,
    ModelEndpoint,
    Session,
    ToolCall,
    Transition,
)
from .states import TURN_ENDED, State

admin.site.site_header = "Agent platform"
admin.site.site_title = "Agent platform"
admin.site.index_title = "Operations"

TIMELINE_LIMIT = 500
DETAIL_CHARS = 4000

STATE_COLOURS = {
    "idle": "#6b7280",
    "processing": "#2563eb",
    "tool_wait": "#7c3aed",
    "tool_loop": "#4f46e5",
    "paused_for_user": "#b45309",
    "awaiting_approval": "#c2410c",
    "waiting_timer": "#0f766e",
    "error": "#dc2626",
    "finished": "#15803d",
    "cancelled": "#374151",
}


def state_badge(state: str) -> str:
    colour = STATE_COLOURS.get(state, "#6b7280")
    return format_html(
        '<span class="ap-state" style="background:{};color:#fff;padding:1px 7px;border-radius:9px;'
        'font-size:11px;white-space:nowrap">{}</span>',
        colour,
        state.replace("_", " "),
    )


def short(value: Any, length: int = 120) -> str:
    if value is None:
        return ""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return Truncator(" ".join(text.split())).chars(length)


def pretty_json(value: Any, limit: int = DETAIL_CHARS) -> str:
    text = json.dumps(value, ensure_ascii=False, indent=2, default=str)
    if len(text) > limit:
        text = text[:limit] + f"\n… ({len(text) - limit} more characters)"
    return text


def pre(value: Any) -> str:
    return format_html(
        '<pre style="margin:0;white-space:pre-wrap;max-width:90ch">{}</pre>',
        pretty_json(value, 50000),
    )


def session_link(session_id: object) -> str:
    url = reverse("admin:agent_sessions_session_change", args=[session_id])
    return format_html(
        '<a href="{}" title="{}"><code>{}</code></a>', url, session_id, str(session_id)[:8]
    )


# ---------------------------------------------------------------- models and agents


@admin.register(ModelEndpoint)
class ModelEndpointAdmin(admin.ModelAdmin):
    formfield_overrides = {models.URLField: {"assume_scheme": "https"}, **JSON_FIELD}
    list_display = (
        "name",
        "api",
        "base_url",
        "model",
        "enabled",
        "price_input_per_1k",
        "price_output_per_1k",
        "context_window",
        "breaker",
        "key_status",
        "updated_at",
    )
    list_filter = ("api", "enabled")
    search_fields = ("name", "model", "base_url")
    actions = ("reset_breaker",)

    @admin.display(description="circuit breaker")
    def breaker(self, obj: ModelEndpoint) -> str:
        state = model_breaker().state(obj.name)
        if state.state == "closed":
            return f"closed ({state.failures} recent failures)" if state.failures else "closed"
        until = datetime.fromtimestamp(state.open_until, tz=UTC).strftime("%H:%M:%S UTC")
        return f"{state.state} until {until} ({state.failures} failures)"

    @admin.display(description="API key")
    def key_status(self, obj: ModelEndpoint) -> str:
        # The endpoint is misconfigured: its calls are refused until the variable is set.
        if obj.missing_key_env:
            return format_html(
                '<strong style="color:#dc2626">misconfigured: {} is not set</strong>',
                obj.missing_key_env,
            )
        return f"from {obj.api_key_env}" if obj.api_key_env else "none"

    @admin.action(description="Reset the circuit breaker")
    def reset_breaker(self, request: HttpRequest, queryset: QuerySet[ModelEndpoint]) -> None:
        for endpoint in queryset:
            model_breaker().reset(endpoint.name)
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
        ("Timeouts", {"fields": ("connect_timeout_s", "first_token_timeout_s", "total_timeout_s")}),
        (
            "Prices and limits",
            {"fields": ("price_input_per_1k", "price_output_per_1k", "context_window")},
        ),
        ("Options", {"fields": ("options", "updated_at")}),
    )


_rules_validator = Draft202012Validator({"type": "array", "items": RULE})


class AgentAdminForm(forms.ModelForm):
    class Meta:
        model = Agent
        fields = (
            "slug",
            "name",
            "enabled",
            "system_prompt",
            "model",
            "fallback_model",
            "candidate_model",
            "candidate_percent",
            "context_window",
            "max_iterations",
            "repeat_call_limit",
            "same_result_limit",
            "step_timeout_s",
            "turn_timeout_s",
            "tools",
            "rules",
            "busy_message",
        )
        widgets = {
            "system_prompt": forms.Textarea(attrs={"rows": 8, "cols": 100}),
            "tools": forms.TextInput(attrs={"size": 90}),
        }

    def clean_tools(self) -> list[str]:
        names: list[str] = self.cleaned_data.get("tools") or []
        known = set(Tool.objects.filter(name__in=names).values_list("name", flat=True))
        unknown = [name for name in names if name not in known]
        if unknown:
            raise forms.ValidationError(f"Unknown tool(s): {', '.join(unknown)}.")
        if len(set(names)) != len(names):
            raise forms.ValidationError("A tool is listed twice.")
        return names

    def clean_rules(self) -> Any:
        rules = self.cleaned_data.get("rules")
        if rules in (None, ""):
            return []
        errors = sorted(
            _rules_validator.iter_errors(rules), key=lambda e: list(map(str, e.absolute_path))
        )
        if errors:
            first = errors[0]
            where = "".join(f"[{p}]" for p in first.absolute_path) or "(top level)"
            raise forms.ValidationError(f"Invalid rules at {where}: {first.message}")
        return rules


@admin.register(Agent)
class AgentAdmin(admin.ModelAdmin):
    form = AgentAdminForm
    formfield_overrides = JSON_FIELD
    list_display = (
        "slug",
        "name",
        "model",
        "fallback_model",
        "rollout",
        "tool_count",
        "max_iterations",
        "enabled",
        "session_count",
    )
    list_filter = ("enabled", "model")
    list_select_related = ("model", "fallback_model", "candidate_model")
    search_fields = ("slug", "name", "system_prompt")
    readonly_fields = ("created_at", "updated_at")
    fieldsets = (
        (None, {"fields": ("slug", "name", "enabled", "system_prompt")}),
        (
            "Model",
            {
                "fields": (
                    "model",
                    "fallback_model",
                    "candidate_model",
                    "candidate_percent",
                    "context_window",
                ),
                "description": "Edits apply at the next step of every session. The candidate model gets "
                "candidate_percent of sessions (sticky per session) for a gradual rollout.",
            },
        ),
        (
            "Loop guards and time limits",
            {
                "fields": (
                    "max_iterations",
                    "repeat_call_limit",
                    "same_result_limit",
                    "step_timeout_s",
                    "turn_timeout_s",
                )
            },
        ),
        ("Tools", {"fields": ("tools",), "description": "Comma-separated tool names."}),
        ("Offline rules model", {"fields": ("rules",), "classes": ("collapse",)}),
        ("Other", {"fields": ("busy_message", "created_at", "updated_at")}),
    )

    def get_queryset(self, request: HttpRequest) -> QuerySet[Agent]:
        return super().get_queryset(request).annotate(_session_count=Count("sessions"))

    @admin.display(description="rollout")
    def rollout(self, obj: Agent) -> str:
        if obj.candidate_model_id and obj.candidate_percent:
            return f"{obj.candidate_percent}% → {obj.candidate_model}"
        return "—"

    @admin.display(description="tools")
    def tool_count(self, obj: Agent) -> int:
        return len(obj.tools or [])

    @admin.display(description="sessions", ordering="_session_count")
    def session_count(self, obj: Agent) -> str:
        count = getattr(obj, "_session_count", 0)
        url = reverse("admin:agent_sessions_session_changelist") + f"?agent__id__exact={obj.pk}"
        return format_html('<a href="{}">{}</a>', url, count)


# ---------------------------------------------------------------- sessions and the timeline


@dataclass
class TimelineItem:
    at: datetime
    rank: int
    order: int
    kind: str
    label: str
    seq: int | None
    summary: str
    detail: str
    url: str
    state: str = ""
    day_label: str = ""

    @property
    def time_label(self) -> str:
        local = timezone.localtime(self.at)
        return local.strftime("%H:%M:%S.") + f"{local.microsecond // 1000:03d}"


KINDS = {
    "transition": ("Transition", 0),
    "message": ("Message", 1),
    "toolcall": ("Tool call", 2),
    "event": ("Event", 3),
    "checkpoint": ("Checkpoint", 4),
}


def _event_summary(type_: str, data: dict[str, Any]) -> str:
    if not isinstance(data, dict):
        return short(data)
    if type_ == EventType.STATE_CHANGED:
        return f"{data.get('from')} → {data.get('to')} ({data.get('trigger')})"
    if type_ == EventType.MESSAGE_COMPLETED:
        calls = ", ".join(
            str(c.get("name", "?")) for c in data.get("tool_calls") or [] if isinstance(c, dict)
        )
        text = short(data.get("content"), 160)
        return f"{data.get('role')}: {text}" + (f" → {calls}" if calls else "")
    if type_ == EventType.TOOL_STARTED:
        return f"{data.get('tool')}({short(data.get('input'), 100)})"
    if type_ == EventType.TOOL_FINISHED:
        return f"{data.get('tool')} {data.get('status')} in {data.get('elapsed_ms')} ms" + (
            f": {short(data.get('error'), 100)}" if data.get("error") else ""
        )
    if type_ == EventType.TURN_FINISHED:
        usage = data.get("usage") or {}
        return (
            f"turn {data.get('turn')} {data.get('stop_reason')}, {data.get('iterations')} model call(s), "
            f"{usage.get('input_tokens', 0)}+{usage.get('output_tokens', 0)} tokens, cost {usage.get('cost', 0)}"
        )
    if type_ == EventType.ERROR:
        return f"{data.get('code')}: {short(data.get('message'), 160)}"
    return short(data, 160)


def session_timeline(
    session_id: object, limit: int = TIMELINE_LIMIT
) -> tuple[list[TimelineItem], bool]:
    """The last `limit` things that happened to a session, oldest first; True if older ones exist.

    One bounded query per table (each ordered by an indexed column), then a
    merge by time; ties keep the order a step writes them in.
    """
    urls = {kind: reverse(f"admin:agent_sessions_{kind}_changelist") for kind in KINDS}
    items: list[TimelineItem] = []
    truncated = False

    def add(
        kind: str,
        pk: int,
        at: datetime,
        order: int,
        seq: int | None,
        summary: str,
        detail: Any,
        state: str = "",
    ) -> None:
        label, rank = KINDS[kind]
        items.append(
            TimelineItem(
                at=at,
                rank=rank,
                order=order,
                kind=kind,
                label=label,
                seq=seq,
                summary=summary,
                detail=pretty_json(detail),
                url=f"{urls[kind]}{pk}/change/",
                state=state,
            )
        )

    rows = list(
        Transition.objects.filter(session_id=session_id)
        .order_by("-id")
        .values(
            "id", "at", "from_state", "to_state", "trigger", "reason", "actor", "version", "turn"
        )[: limit + 1]
    )
    truncated |= len(rows) > limit
    for r in rows[:limit]:
        summary = f"{r['from_state']} → {r['to_state']} ({r['trigger']})"
        if r["reason"]:
            summary += f": {short(r['reason'], 120)}"
        if r["actor"]:
            summary += f" by {r['actor']}"
        add("transition", r["id"], r["at"], r["id"], None, summary, r, state=r["to_state"])

    rows = list(
        Message.objects.filter(session_id=session_id)
        .order_by("-id")
        .values(
            "id",
            "created_at",
            "seq",
            "turn",
            "role",
            "status",
            "content",
            "tool_calls",
            "tool_call_id",
            "name",
            "data",
            "token_count",
        )[: limit + 1]
    )
    truncated |= len(rows) > limit
    for r in rows[:limit]:
        who = r["role"] + (f" ({r['name']})" if r["name"] else "")
        summary = f"{who}: {short(r['content'], 200)}"
        calls = [c.get("name", "?") for c in r["tool_calls"] or [] if isinstance(c, dict)]
        if calls:
            summary += " → " + ", ".join(map(str, calls))
        if r["status"] == "queued":
            summary += " [queued]"
        add("message", r["id"], r["created_at"], r["id"], r["seq"], summary, r)

    rows = list(
        ToolCall.objects.filter(session_id=session_id)
        .order_by("-id")
        .values(
            "id",
            "created_at",
            "finished_at",
            "turn",
            "step",
            "position",
            "call_id",
            "tool_name",
            "input",
            "status",
            "output",
            "error",
            "elapsed_ms",
            "idempotency_key",
        )[: limit + 1]
    )
    truncated |= len(rows) > limit
    for r in rows[:limit]:
        summary = f"{r['tool_name']}({short(r['input'], 100)}) {r['status']}"
        if r["elapsed_ms"] is not None:
            summary += f" in {r['elapsed_ms']} ms"
        if r["error"]:
            summary += f": {short(r['error'], 100)}"
        add("toolcall", r["id"], r["created_at"], r["id"], None, summary, r)

    rows = list(
        Event.objects.filter(session_id=session_id)
        .order_by("-seq")
        .values("id", "created_at", "seq", "type", "data")[: limit + 1]
    )
    truncated |= len(rows) > limit
    for r in rows[:limit]:
        add(
            "event",
            r["id"],
            r["created_at"],
            r["seq"],
            r["seq"],
            f"{r['type']} · {_event_summary(r['type'], r['data'])}",
            r,
        )

    rows = list(
        Checkpoint.objects.filter(session_id=session_id)
        .order_by("-step")
        .values(
            "id", "created_at", "step", "turn", "state", "message_seq", "size_bytes", "context"
        )[: limit + 1]
    )
    truncated |= len(rows) > limit
    for r in rows[:limit]:
        phase = (r["context"] or {}).get("phase", "") if isinstance(r["context"], dict) else ""
        summary = f"step {r['step']} · {r['state']} · {phase} · {r['size_bytes']} bytes"
        add("checkpoint", r["id"], r["created_at"], r["step"], None, summary, r, state=r["state"])

    items.sort(key=lambda i: (i.at, i.rank, i.order))
    if len(items) > limit:
        truncated = True
        items = items[-limit:]
    day = ""
    for item in items:
        this_day = timezone.localtime(item.at).strftime("%Y-%m-%d")
        if this_day != day:
            item.day_label = day = this_day
    return items, truncated


class SessionIdSearch(admin.ModelAdmin):
    """A full session id in the search box is an exact, indexed lookup."""

    session_lookup = "session_id"

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[Any], bool]:
        try:
            session_id = uuid.UUID(search_term.strip())
        except ValueError:
            return super().get_search_results(request, queryset, search_term)
        return queryset.filter(**{self.session_lookup: session_id}), False


@admin.register(Session)
class SessionAdmin(SessionIdSearch):
    change_form_template = "admin/agent_sessions/session/change_form.html"
    list_display = (
        "short_id",
        "agent",
        "owner",
        "role",
        "state_display",
        "turns",
        "tokens",
        "cost_display",
        "models_used",
        "updated",
    )
    list_filter = ("state", "agent", "role", "model_calls__endpoint_name")
    # A full id is an exact lookup; a part of one (the short id shown) a text match.
    session_lookup = "pk"
    search_fields = ("id", "owner__username", "agent__slug")
    date_hierarchy = "created_at"
    list_select_related = ("agent", "owner")
    ordering = ("-created_at",)
    actions = ("cancel_running_turn", "resume_failed_run")
    formfield_overrides = JSON_FIELD
    readonly_fields = (
        "id",
        "agent",
        "owner",
        "role",
        "state_display",
        "cancel_requested",
        "last_error",
        "turn",
        "step",
        "iteration",
        "queued_count",
        "input_tokens",
        "output_tokens",
        "cost",
        "version",
        "lease_owner",
        "lease_expires_at",
        "message_seq",
        "event_seq",
        "created_at",
        "updated_at",
        "checkpoint_stats",
        "cancel_reason",
        "cancel_actor",
        "timer_due_at",
        "timer_note",
        "forked_from",
        "forked_at_step",
    )
    fieldsets = (
        (
            None,
            {
                "fields": (
                    "id",
                    "agent",
                    "owner",
                    "role",
                    "state_display",
                    "cancel_requested",
                    "last_error",
                )
            },
        ),
        (
            "Usage",
            {
                "fields": (
                    "turn",
                    "step",
                    "iteration",
                    "queued_count",
                    "input_tokens",
                    "output_tokens",
                    "cost",
                )
            },
        ),
        (
            "Engine bookkeeping",
            {
                "fields": (
                    "version",
                    "lease_owner",
                    "lease_expires_at",
                    "message_seq",
                    "event_seq",
                    "created_at",
                    "updated_at",
                ),
                "classes": ("collapse",),
            },
        ),
        (
            "Durability",
            {
                "fields": (
                    "checkpoint_stats",
                    "cancel_reason",
                    "cancel_actor",
                    "timer_due_at",
                    "timer_note",
                    "forked_from",
                    "forked_at_step",
                )
            },
        ),
        ("Metadata", {"fields": ("metadata",)}),
    )

    @admin.display(description="id", ordering="id")
    def short_id(self, obj: Session) -> str:
        return format_html('<code title="{}">{}</code>', obj.pk, str(obj.pk)[:8])

    @admin.display(description="state", ordering="state")
    def state_display(self, obj: Session) -> str:
        return state_badge(obj.state)

    @admin.display(description="turns", ordering="turn")
    def turns(self, obj: Session) -> int:
        return obj.turn

    @admin.display(description="tokens in / out", ordering="input_tokens")
    def tokens(self, obj: Session) -> str:
        return f"{obj.input_tokens} / {obj.output_tokens}"

    @admin.display(description="updated", ordering="updated_at")
    def updated(self, obj: Session) -> str:
        return timezone.localtime(obj.updated_at).strftime("%Y-%m-%d %H:%M:%S")

    @admin.display(description="cost", ordering="cost")
    def cost_display(self, obj: Session) -> str:
        return f"{obj.cost:.6f}".rstrip("0").rstrip(".")

    def get_queryset(self, request: HttpRequest) -> QuerySet[Session]:
        # One aggregate for the list instead of a query per row.
        return (
            super()
            .get_queryset(request)
            .annotate(
                _models=StringAgg(
                    "model_calls__endpoint_name", delimiter=", ", distinct=True, default=""
                )
            )
        )

    @admin.display(description="models used")
    def models_used(self, obj: Session) -> str:
        return getattr(obj, "_models", "") or "—"

    def has_add_permission(self, request: HttpRequest) -> bool:
        # Sessions are opened through the API, by the key that owns them.
        return False

    @admin.action(description="Cancel the running turn", permissions=["change"])
    def cancel_running_turn(self, request: HttpRequest, queryset: QuerySet[Session]) -> None:
        cancelled, idle = self._cancel(request, list(queryset))
        if cancelled:
            self.message_user(
                request, f"Cancel requested for {cancelled} session(s).", messages.SUCCESS
            )
        if idle:
            self.message_user(
                request, f"{idle} session(s) had no running turn to cancel.", messages.WARNING
            )

    @admin.action(description="Resume a run that stopped in error", permissions=["change"])
    def resume_failed_run(self, request: HttpRequest, queryset: QuerySet[Session]) -> None:
        actor = f"admin:{request.user.get_username()}"
        resumed, refused = 0, []
        for session in queryset:
            try:
                services.session_resume(session=session, actor=actor)
                resumed += 1
            except services.Conflict as exc:
                refused.append(f"{str(session.pk)[:8]}: {exc.message}")
        if resumed:
            self.message_user(request, f"Resumed {resumed} session(s).", messages.SUCCESS)
        for line in refused:
            self.message_user(request, line, messages.WARNING)

    @admin.display(description="checkpoints")
    def checkpoint_stats(self, obj: Session) -> str:
        stats = obj.checkpoints.aggregate(count=Count("id"), size=Sum("size_bytes"))
        url = reverse("admin:agent_sessions_checkpoint_changelist") + f"?q={obj.pk}"
        return format_html(
            '<a href="{}">{} checkpoints, {} bytes</a>', url, stats["count"], stats["size"] or 0
        )

    def _cancel(self, request: HttpRequest, sessions: list[Session]) -> tuple[int, int]:
        actor = f"admin:{request.user.get_username()}"
        done = 0
        for session in sessions:
            if services.session_cancel(
                session=session, reason="cancelled by operator", actor=actor
            ):
                done += 1
        return done, len(sessions) - done

    def get_urls(self) -> list[Any]:
        urls = [
            path(
                "<path:object_id>/cancel/",
                self.admin_site.admin_view(self.cancel_view),
                name="agent_sessions_session_cancel",
            )
        ]
        return urls + super().get_urls()

    def cancel_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        try:
            session_id = uuid.UUID(object_id)
        except ValueError:  # the lookup would raise it: no such session, not a 500
            raise Http404("no such session") from None
        session = get_object_or_404(Session, pk=session_id)
        if not self.has_change_permission(request, session):
            raise PermissionDenied
        cancelled, _ = self._cancel(request, [session])
        if cancelled:
            self.message_user(
                request, "Cancel requested; the run stops at its next step.", messages.SUCCESS
            )
        else:
            self.message_user(
                request, "This session has no running turn to cancel.", messages.WARNING
            )
        return HttpResponseRedirect(
            reverse("admin:agent_sessions_session_change", args=[session.pk])
        )

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        extra_context = dict(extra_context or {})
        try:
            session_id = uuid.UUID(str(object_id))
        except ValueError:  # not a UUID: the admin itself says the object does not exist
            return super().change_view(request, object_id, form_url, extra_context=extra_context)
        items, truncated = session_timeline(session_id)
        extra_context.update(
            timeline=items,
            timeline_truncated=truncated,
            timeline_limit=TIMELINE_LIMIT,
            timeline_kinds=[(kind, label) for kind, (label, _) in KINDS.items()],
            history_links=[
                (
                    label,
                    reverse(f"admin:agent_sessions_{kind}_changelist") + f"?session={session_id}",
                )
                for kind, (label, _) in KINDS.items()
            ],
            cancellable_states=[s.value for s in State if s not in TURN_ENDED],
        )
        return super().change_view(request, object_id, form_url, extra_context=extra_context)


# ---------------------------------------------------------------- the history, read-only


class ReadOnlyAdmin(SessionIdSearch):
    """History rows: viewable, never added, changed or deleted by hand."""

    list_per_page = 100
    show_full_result_count = False
    search_help_text = (
        "Paste a full session id to see only that session's rows, or search the text."
    )

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="session", ordering="session")
    def session_short(self, obj: Any) -> str:
        return session_link(obj.session_id)


@admin.register(Message)
class MessageAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "session_short",
        "seq",
        "turn",
        "role",
        "status",
        "content_short",
        "token_count",
        "created_at",
    )
    list_filter = ("role", "status")
    search_fields = ("content", "name", "idempotency_key")
    ordering = ("-id",)
    fields = (
        "session_short",
        "seq",
        "turn",
        "role",
        "status",
        "name",
        "tool_call_id",
        "content",
        "tool_calls_pretty",
        "data_pretty",
        "token_count",
        "idempotency_key",
        "created_at",
    )
    readonly_fields = fields

    @admin.display(description="content")
    def content_short(self, obj: Message) -> str:
        return short(obj.content, 100)

    @admin.display(description="tool calls")
    def tool_calls_pretty(self, obj: Message) -> str:
        return pre(obj.tool_calls)

    @admin.display(description="data")
    def data_pretty(self, obj: Message) -> str:
        return pre(obj.data)


@admin.register(ToolCall)
class ToolCallAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "session_short",
        "turn",
        "step",
        "tool_name",
        "status",
        "elapsed_ms",
        "created_at",
        "finished_at",
    )
    list_filter = ("status", "tool_name")
    search_fields = ("tool_name", "call_id", "idempotency_key")
    ordering = ("-id",)
    fields = (
        "session_short",
        "turn",
        "step",
        "position",
        "call_id",
        "tool_name",
        "status",
        "elapsed_ms",
        "attempts",
        "cached",
        "coercions",
        "input_pretty",
        "output_pretty",
        "error",
        "idempotency_key",
        "created_at",
        "finished_at",
    )
    readonly_fields = fields

    @admin.display(description="input")
    def input_pretty(self, obj: ToolCall) -> str:
        return pre(obj.input)

    @admin.display(description="output")
    def output_pretty(self, obj: ToolCall) -> str:
        return pre(obj.output)


@admin.register(Transition)
class TransitionAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "session_short",
        "from_state",
        "to_state",
        "trigger",
        "turn",
        "version",
        "actor",
        "at",
    )
    list_filter = ("to_state", "trigger")
    search_fields = ("actor", "reason")
    ordering = ("-id",)
    fields = (
        "session_short",
        "from_state",
        "to_state",
        "trigger",
        "reason",
        "turn",
        "version",
        "actor",
        "at",
    )
    readonly_fields = fields


@admin.register(Checkpoint)
class CheckpointAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "session_short",
        "step",
        "turn",
        "state",
        "message_seq",
        "size_bytes",
        "created_at",
    )
    list_filter = ("state",)
    search_fields = ("=state",)
    ordering = ("-id",)
    fields = (
        "session_short",
        "step",
        "turn",
        "state",
        "message_seq",
        "size_bytes",
        "fingerprint",
        "context_pretty",
        "created_at",
    )
    readonly_fields = fields
    actions = ("fork_from_checkpoint",)

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        # History is read-only, but forking writes a new session, not this row.
        return admin.ModelAdmin.get_actions(self, request)

    @admin.action(description="Fork a new session from this checkpoint")
    def fork_from_checkpoint(self, request: HttpRequest, queryset: QuerySet[Checkpoint]) -> None:
        actor = f"admin:{request.user.get_username()}"
        for checkpoint in queryset.select_related("session"):
            fork = services.session_fork(
                session=checkpoint.session, step=checkpoint.step, actor=actor
            )
            url = reverse("admin:agent_sessions_session_change", args=[fork.pk])
            self.message_user(
                request,
                format_html(
                    'Forked <a href="{}">{}</a> from step {}.',
                    url,
                    str(fork.pk)[:8],
                    checkpoint.step,
                ),
                messages.SUCCESS,
            )

    @admin.display(description="context (what changed in this step)")
    def context_pretty(self, obj: Checkpoint) -> str:
        return pre(obj.context)


@admin.register(Event)
class EventAdmin(ReadOnlyAdmin):
    list_display = ("id", "session_short", "seq", "type", "summary", "created_at")
    list_filter = ("type",)
    search_fields = ("type",)
    ordering = ("-id",)
    fields = ("session_short", "seq", "type", "data_pretty", "created_at")
    readonly_fields = fields

    @admin.display(description="summary")
    def summary(self, obj: Event) -> str:
        return _event_summary(obj.type, obj.data)

    @admin.display(description="data")
    def data_pretty(self, obj: Event) -> str:
        return pre(obj.data)


@admin.register(ModelCall)
class ModelCallAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "session_short",
        "turn",
        "endpoint_name",
        "model",
        "outcome",
        "input_tokens",
        "output_tokens",
        "first_token_ms",
        "total_ms",
        "retried",
        "fallback_used",
        "rollout",
        "cost",
        "created_at",
    )
    list_filter = ("outcome", "endpoint_name", "fallback_used", "rollout", "retried")
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
        "cost",
        "created_at",
    )
    readonly_fields = fields
