"""The audit trail in the admin: read-only, newest first, filtered by actor, action, object
type and date.

Listed to superusers and to staff holding `audit | audit entry | Can view`; a staff user who
is not a superuser sees the entries about their own tenant's objects and their own actions.
What people said (an approval's arguments, a session's) takes `view_message_content` too.
"""

import json
from typing import Any

from django.apps import apps
from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import NoReverseMatch, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.text import Truncator

from accounts.admin_access import MESSAGE_CONTENT, ContentMaskedAdmin, hidden_text

from .models import AuditEntry
from .selectors import audit_entries_visible

# Object types whose before and after hold what people said (arguments, messages).
CONTENT_TYPES = frozenset({"approvals.approval", "agent_sessions.session"})


def type_label(label: str) -> str:
    try:
        return str(apps.get_model(label)._meta.verbose_name)
    except (LookupError, ValueError):
        return label


class ObjectTypeFilter(admin.SimpleListFilter):
    title = "object type"
    parameter_name = "object_type"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        types = (
            audit_entries_visible(user=request.user)
            .order_by()
            .values_list("object_type", flat=True)
            .distinct()
        )
        return sorted(((t, type_label(t)) for t in types), key=lambda pair: pair[1])

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(object_type=self.value()) if self.value() else queryset


class ActorFilter(admin.SimpleListFilter):
    title = "actor"
    parameter_name = "actor"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        actors = (
            audit_entries_visible(user=request.user)
            .order_by("actor")
            .values_list("actor", flat=True)
            .distinct()[:50]
        )
        return [(a, a) for a in actors]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(actor=self.value()) if self.value() else queryset


def _changes_text(entry: AuditEntry) -> str:
    fields = sorted(set(entry.before or {}) | set(entry.after or {}))
    return ", ".join(fields)


@admin.register(AuditEntry)
class AuditEntryAdmin(ContentMaskedAdmin, admin.ModelAdmin):
    list_display = ("when", "actor", "action_display", "object_link", "changed", "reason_short")
    list_filter = (ActorFilter, "action", ObjectTypeFilter, "at")
    search_fields = ("actor", "object_id", "object_repr", "key_prefix")
    search_help_text = "Search an actor, an object's id or name, or a key prefix."
    date_hierarchy = "at"
    list_per_page = 100
    show_full_result_count = False
    fields = (
        "when",
        "actor",
        "user",
        "key_prefix",
        "action_display",
        "object_link",
        "owner",
        "reason",
        "before_pretty",
        "after_pretty",
        "data_pretty",
    )
    readonly_fields = fields
    # Without the content permission, an approval's or a session's before and after are
    # hidden (they hold what the model and the user said); other objects' show.
    content_permission = MESSAGE_CONTENT
    content_fields = {"before_pretty": "before_guarded", "after_pretty": "after_guarded"}

    def get_queryset(self, request: HttpRequest) -> QuerySet[AuditEntry]:
        return audit_entries_visible(user=request.user).select_related("user", "owner")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="at", ordering="at")
    def when(self, obj: AuditEntry) -> str:
        return timezone.localtime(obj.at).strftime("%Y-%m-%d %H:%M:%S")

    @admin.display(description="action", ordering="action")
    def action_display(self, obj: AuditEntry) -> str:
        return format_html('<code title="{}">{}</code>', obj.get_action_display(), obj.action)

    @admin.display(description="object", ordering="object_type")
    def object_link(self, obj: AuditEntry) -> str:
        label = f"{type_label(obj.object_type)} {obj.object_repr or obj.object_id}"
        app_label, _, model_name = obj.object_type.partition(".")
        try:
            url = reverse(f"admin:{app_label}_{model_name}_change", args=[obj.object_id])
        except NoReverseMatch:
            return label
        return format_html('<a href="{}">{}</a>', url, Truncator(label).chars(60))

    @admin.display(description="changed")
    def changed(self, obj: AuditEntry) -> str:
        return Truncator(_changes_text(obj)).chars(60) or "—"

    @admin.display(description="reason")
    def reason_short(self, obj: AuditEntry) -> str:
        return Truncator(" ".join(obj.reason.split())).chars(60) or "—"

    @staticmethod
    def _json(value: Any) -> str:
        if value is None:
            return "—"
        return format_html(
            '<pre style="margin:0;white-space:pre-wrap;max-width:100ch">{}</pre>',
            json.dumps(value, ensure_ascii=False, indent=2),
        )

    @admin.display(description="before")
    def before_pretty(self, obj: AuditEntry) -> str:
        return self._json(obj.before)

    @admin.display(description="after")
    def after_pretty(self, obj: AuditEntry) -> str:
        return self._json(obj.after)

    @admin.display(description="before")
    def before_guarded(self, obj: AuditEntry) -> str:
        if obj.object_type in CONTENT_TYPES:
            return hidden_text(MESSAGE_CONTENT)
        return self._json(obj.before)

    @admin.display(description="after")
    def after_guarded(self, obj: AuditEntry) -> str:
        if obj.object_type in CONTENT_TYPES:
            return hidden_text(MESSAGE_CONTENT)
        return self._json(obj.after)

    @admin.display(description="details")
    def data_pretty(self, obj: AuditEntry) -> str:
        return self._json(obj.data or None)
