"""A session's stored history, one list per table: messages, tool calls, transitions,
checkpoints (each with what happened at its step; forkable) and events.

What was said (a message's text, a tool call's input and output, an event's payload, a
checkpoint's context and last message) takes `view_message_content` on top of each list's
view permission; forking takes `fork_session` and a confirmation after its preview (a fork
may repeat side effects)."""

from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.utils.html import format_html

from accounts.admin_access import MESSAGE_CONTENT, ContentMaskedAdmin, holds, masked
from accounts.tenancy import TenantScopedAdmin
from record.errors import DomainError
from record.models import Checkpoint, Event, Message, ToolCall, Transition

from ..previews import CheckpointStory, checkpoints_described
from ..selectors import tool_calls_in_status, tool_calls_waiting_marked
from ..status import CALLS
from .base import ReadOnlyAdmin
from .display import arguments_diff, call_badge, event_summary, pre, short
from .previews import fork_preview_page


class CallStatusFilter(admin.SimpleListFilter):
    """A call's status in the words its badge uses (sessions/status.py CALLS)."""

    title = "status"
    parameter_name = "call_status"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(key, status.label) for key, status in CALLS.items()]

    def queryset(self, request: HttpRequest, queryset: QuerySet[ToolCall]) -> QuerySet[ToolCall]:
        value = self.value()
        return tool_calls_in_status(queryset, value) if value else queryset


class MessageContentAdmin(ContentMaskedAdmin):
    content_permission = MESSAGE_CONTENT


@admin.register(Message)
class MessageAdmin(MessageContentAdmin, TenantScopedAdmin, ReadOnlyAdmin):
    tenant_owner_path = "session__owner"
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
    content_fields = {
        "content_short": "content_hidden",
        "content": "content_hidden",
        "tool_calls_pretty": "tool_calls_hidden",
        "data_pretty": "data_hidden",
    }
    content_search_fields = ("content",)
    content_hidden = masked("content", MESSAGE_CONTENT)
    tool_calls_hidden = masked("tool calls", MESSAGE_CONTENT)
    data_hidden = masked("data", MESSAGE_CONTENT)

    @admin.display(description="content")
    def content_short(self, obj: Message) -> str:
        return short(obj.content, 100)

    @admin.display(description="tool calls")
    def tool_calls_pretty(self, obj: Message) -> str:
        return pre(obj.tool_calls)

    @admin.display(description="data")
    def data_pretty(self, obj: Message) -> str:
        return pre(obj.data)


class EditedFilter(admin.SimpleListFilter):
    """Calls that ran with an approver's edited arguments."""

    title = "approver's edit"
    parameter_name = "edited"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("yes", "edited by an approver"), ("no", "as the model proposed")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[ToolCall]) -> QuerySet[ToolCall]:
        if self.value() == "yes":
            return queryset.filter(proposed_input__isnull=False)
        if self.value() == "no":
            return queryset.filter(proposed_input__isnull=True)
        return queryset


@admin.register(ToolCall)
class ToolCallAdmin(MessageContentAdmin, TenantScopedAdmin, ReadOnlyAdmin):
    tenant_owner_path = "session__owner"
    list_display = (
        "id",
        "session_short",
        "turn",
        "step",
        "tool_name",
        "status_display",
        "edited",
        "risk",
        "elapsed_ms",
        "created_at",
        "finished_at",
    )
    list_filter = (CallStatusFilter, EditedFilter, "risk_level", "tool_name")
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
        "refusal",
        "elapsed_ms",
        "attempts",
        "cached",
        "coercions",
        "input_pretty",
        "proposed_input_pretty",
        "output_pretty",
        "error",
        "risk_level",
        "risk_reason",
        "idempotency_key",
        "dispatched_at",
        "probe_outcome",
        "probes",
        "created_at",
        "finished_at",
    )
    readonly_fields = fields
    content_fields = {
        "input_pretty": "input_hidden",
        "proposed_input_pretty": "proposed_input_hidden",
        "output_pretty": "output_hidden",
        "error": "error_hidden",
        "edited": "edited_hidden",
    }
    input_hidden = masked("input (what ran)", MESSAGE_CONTENT)
    proposed_input_hidden = masked("proposed input (the model's)", MESSAGE_CONTENT)
    edited_hidden = masked("approver's edit", MESSAGE_CONTENT)
    output_hidden = masked("output", MESSAGE_CONTENT)
    error_hidden = masked("error", MESSAGE_CONTENT)

    @admin.display(description="risk", ordering="risk_level")
    def risk(self, obj: ToolCall) -> str:
        # The level and, on hover, why (declared, or what the assessment saw).
        if obj.risk_level is None:
            return "–"
        return format_html('<span title="{}">{}</span>', obj.risk_reason, obj.risk_level)

    def get_queryset(self, request: HttpRequest) -> QuerySet[ToolCall]:
        return tool_calls_waiting_marked(super().get_queryset(request))

    @admin.display(description="status", ordering="status")
    def status_display(self, obj: ToolCall) -> str:
        # The one vocabulary (sessions/status.py): waiting for approval, running, ok, ...
        return call_badge(obj.status, obj.refusal, waiting=bool(getattr(obj, "waiting", False)))

    @admin.display(description="approver's edit")
    def edited(self, obj: ToolCall) -> str:
        """An approver's edit of the arguments: what the model proposed → what ran."""
        if obj.proposed_input is None:
            return "–"
        return arguments_diff(obj.proposed_input, obj.input)

    @admin.display(description="input (what ran)")
    def input_pretty(self, obj: ToolCall) -> str:
        return pre(obj.input)

    @admin.display(description="proposed input (the model's, before an approver's edit)")
    def proposed_input_pretty(self, obj: ToolCall) -> str:
        return pre(obj.proposed_input) if obj.proposed_input is not None else "–"

    @admin.display(description="output")
    def output_pretty(self, obj: ToolCall) -> str:
        return pre(obj.output)


@admin.register(Transition)
class TransitionAdmin(TenantScopedAdmin, ReadOnlyAdmin):
    tenant_owner_path = "session__owner"
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


class CheckpointChangeList(ChangeList):
    """The page's checkpoints, each with what happened at its step (three queries a page)."""

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        stories = checkpoints_described(self.result_list)
        for checkpoint in self.result_list:
            checkpoint.story = stories.get(checkpoint.pk)


def _story(obj: Checkpoint) -> CheckpointStory | None:
    if not hasattr(obj, "story"):
        obj.story = checkpoints_described([obj]).get(obj.pk)  # type: ignore[attr-defined]
    return getattr(obj, "story", None)


@admin.register(Checkpoint)
class CheckpointAdmin(MessageContentAdmin, TenantScopedAdmin, ReadOnlyAdmin):
    tenant_owner_path = "session__owner"
    list_display = (
        "id",
        "session_short",
        "step",
        "turn",
        "state",
        "happened",
        "last_message",
        "size_bytes",
        "at",
    )
    list_filter = ("state",)
    search_fields = ("=state",)
    ordering = ("-id",)
    fields = (
        "session_short",
        "step",
        "turn",
        "state",
        "happened",
        "last_message",
        "message_seq",
        "size_bytes",
        "fingerprint",
        "context_pretty",
        "at",
    )
    readonly_fields = fields
    actions = ("fork_from_checkpoint",)
    content_fields = {
        "context_pretty": "context_hidden",
        "last_message": "last_message_without_content",
    }
    context_hidden = masked("context (what changed in this step)", MESSAGE_CONTENT)

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return CheckpointChangeList

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        # History is read-only, but forking writes a new session, not this row.
        return admin.ModelAdmin.get_actions(self, request)

    def has_fork_permission(self, request: HttpRequest) -> bool:
        return holds(request, "agent_sessions.fork_session")

    @admin.action(
        description="Fork a new session from this checkpoint (preview first)",
        permissions=["fork"],
    )
    def fork_from_checkpoint(
        self, request: HttpRequest, queryset: QuerySet[Checkpoint]
    ) -> HttpResponse | None:
        """The fork's preview (what it copies and may repeat); the fork needs its confirmation."""
        chosen = list(queryset.select_related("session", "session__agent")[:2])
        if len(chosen) != 1:
            self.message_user(request, "Select one checkpoint to fork from.", messages.WARNING)
            return None
        checkpoint = chosen[0]
        try:
            return fork_preview_page(self, request, checkpoint.session, checkpoint.step)
        except DomainError as exc:
            self.message_user(request, exc.message, messages.WARNING)
            return None

    @admin.display(description="what happened")
    def happened(self, obj: Checkpoint) -> str:
        story = _story(obj)
        return story.what if story is not None else "—"

    @admin.display(description="last message")
    def last_message(self, obj: Checkpoint) -> str:
        story = _story(obj)
        if story is None or not story.message_role:
            return "—"
        return f"#{story.message_seq} {story.message_role}: {story.message_text or '—'}"

    @admin.display(description="last message")
    def last_message_without_content(self, obj: Checkpoint) -> str:
        story = _story(obj)
        if story is None or not story.message_role:
            return "—"
        return f"#{story.message_seq} {story.message_role}"

    @admin.display(description="at", ordering="created_at")
    def at(self, obj: Checkpoint) -> str:
        stamp = timezone.localtime(obj.created_at).strftime("%Y-%m-%d %H:%M:%S")
        return format_html('<span style="white-space:nowrap">{}</span>', stamp)

    @admin.display(description="context (what changed in this step)")
    def context_pretty(self, obj: Checkpoint) -> str:
        return pre(obj.context)


@admin.register(Event)
class EventAdmin(MessageContentAdmin, TenantScopedAdmin, ReadOnlyAdmin):
    tenant_owner_path = "session__owner"
    list_display = ("id", "session_short", "seq", "type", "summary", "created_at")
    list_filter = ("type",)
    search_fields = ("type",)
    ordering = ("-id",)
    fields = ("session_short", "seq", "type", "data_pretty", "created_at")
    readonly_fields = fields
    content_fields = {"summary": "summary_without_content", "data_pretty": "data_hidden"}
    data_hidden = masked("data", MESSAGE_CONTENT)

    @admin.display(description="summary")
    def summary(self, obj: Event) -> str:
        return event_summary(obj.type, obj.data)

    @admin.display(description="summary")
    def summary_without_content(self, obj: Event) -> str:
        return event_summary(obj.type, obj.data, content=False)

    @admin.display(description="data")
    def data_pretty(self, obj: Event) -> str:
        return pre(obj.data)
