"""Operators list, search, edit and erase what is remembered, per owner.

What an item says is a person's own: "view" lists items with their content masked; seeing
it takes `view_memory_content`, and editing or adding takes that and change (add) too,
since an edited item reaches its owner's next prompt. Erasing an owner's memory takes
`erase_memory`. Each operator reaches only their own tenant's items (a superuser all).
"""

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import Count, QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils.html import format_html, format_html_join
from django.utils.text import Truncator

from accounts.admin_access import MEMORY_CONTENT, ContentMaskedAdmin, holds, masked
from accounts.tenancy import TenantScopedAdmin
from audit.edits import AuditedAdmin, admin_actor

from .models import EmbeddingEndpoint, MemoryItem, MemoryOwnerIndex
from .services import embedding_endpoint_save, memory_erase_owner, memory_item_save


class LiveFilter(admin.SimpleListFilter):
    title = "status"
    parameter_name = "live"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("yes", "latest"), ("no", "superseded")]

    def queryset(
        self, request: HttpRequest, queryset: QuerySet[MemoryItem]
    ) -> QuerySet[MemoryItem]:
        if self.value() == "yes":
            return queryset.filter(superseded_at__isnull=True)
        if self.value() == "no":
            return queryset.filter(superseded_at__isnull=False)
        return queryset


class MemoryItemForm(forms.ModelForm):
    class Meta:
        model = MemoryItem
        fields = ("owner", "tag", "subject", "content", "importance", "confidence")

    def clean(self) -> dict[str, Any]:
        """One live item per subject and owner (the database enforces it too): a clear
        form error instead of a failed save."""
        data = super().clean() or {}
        subject = " ".join(str(data.get("subject") or "").lower().split())
        owner_id = (
            self.instance.owner_id if self.instance.pk else getattr(data.get("owner"), "pk", None)
        )
        live = self.instance.pk is None or self.instance.superseded_at is None
        if subject and owner_id and live:
            clash = MemoryItem.objects.filter(
                owner_id=owner_id, subject=subject, superseded_at__isnull=True
            ).exclude(pk=self.instance.pk)
            if clash.exists():
                self.add_error(
                    "subject",
                    f"this owner already has a live item about {subject!r}: edit that one",
                )
        return data


@admin.register(MemoryItem)
class MemoryItemAdmin(ContentMaskedAdmin, AuditedAdmin, TenantScopedAdmin, admin.ModelAdmin):
    list_display = (
        "owner",
        "tag",
        "subject_short",
        "content_short",
        "importance",
        "status",
        "updated_at",
    )
    form = MemoryItemForm
    list_filter = (LiveFilter, "tag", "source")
    search_fields = ("content", "subject", "owner__username", "owner__email")
    list_select_related = ("owner",)
    raw_id_fields = ("owner", "superseded_by")
    actions = ("erase_owners",)
    content_permission = MEMORY_CONTENT
    content_fields = {
        "subject_short": "subject_hidden",
        "content_short": "content_hidden",
        "subject": "subject_hidden",
        "content": "content_hidden",
        "history": "history_hidden",
    }
    content_search_fields = ("content", "subject")
    # The audit trail says an item's text changed, never what it says (an erasure would
    # leave it there).
    audit_withheld = frozenset({"subject", "content", "embedding"})
    subject_hidden = masked("subject", MEMORY_CONTENT)
    content_hidden = masked("content", MEMORY_CONTENT)
    history_hidden = masked("history", MEMORY_CONTENT)
    fields = (
        "owner", "tag", "subject", "content", "importance", "confidence", "source",
        "source_session_id", "superseded_by", "superseded_at", "embedding_model", "dims",
        "created_at", "updated_at", "last_used_at", "history",
    )  # fmt: skip
    readonly_fields = (
        "source", "source_session_id", "superseded_by", "superseded_at", "embedding_model",
        "dims", "created_at", "updated_at", "last_used_at", "history",
    )  # fmt: skip

    @admin.display(description="history")
    def history(self, obj: MemoryItem) -> str:
        """Every value the item held, oldest first: when, what, who brought it, what decided."""
        if obj.pk is None:
            return "-"
        rows = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{} {}</td><td>{}</td><td>{}</td></tr>",
            (
                (
                    f"{v.created_at:%Y-%m-%d %H:%M}",
                    v.action,
                    v.subject,
                    v.content,
                    v.get_actor_display(),
                    v.actor_ref,
                    v.decided_by,
                    v.reason,
                )  # fmt: skip
                for v in obj.versions.order_by("id")
            ),
        )
        return format_html(
            "<table><tr><th>when</th><th>action</th><th>subject</th><th>content</th>"
            "<th>who</th><th>decided by</th><th>why</th></tr>{}</table>",
            rows,
        )

    @admin.display(description="subject")
    def subject_short(self, obj: MemoryItem) -> str:
        return Truncator(obj.subject).chars(30)

    @admin.display(description="content")
    def content_short(self, obj: MemoryItem) -> str:
        return Truncator(obj.content).chars(70)

    @admin.display(description="status")
    def status(self, obj: MemoryItem) -> str:
        if obj.superseded_at is None:
            return "latest"
        return "superseded" if obj.superseded_by_id else "deleted"

    # Whoever edits an item writes into its owner's prompts: only someone who may also read
    # what it says. The owner never changes (that would hand one person's memory to another).
    def has_add_permission(self, request: HttpRequest) -> bool:
        return super().has_add_permission(request) and self.shows_content(request)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return super().has_change_permission(request, obj) and self.shows_content(request)

    def has_erase_permission(self, request: HttpRequest) -> bool:
        return holds(request, "memory.erase_memory")

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        fields = super().get_readonly_fields(request, obj)
        return fields if obj is None else [*fields, "owner"]

    def save_audited(self, request: HttpRequest, obj: MemoryItem, form: Any, change: bool) -> None:
        # An edited text gets its new vector, or search would keep finding the old one.
        memory_item_save(
            item=obj,
            reembed=not change or "content" in form.changed_data,
            actor_ref=admin_actor(request),
        )

    @admin.action(
        description="Erase everything remembered about the selected items' owners",
        permissions=["erase"],
    )
    def erase_owners(
        self, request: HttpRequest, queryset: QuerySet[MemoryItem]
    ) -> HttpResponse | None:
        owner_ids = sorted(set(queryset.values_list("owner_id", flat=True)))
        if request.POST.get("confirm") != "yes":
            counts = (
                MemoryItem.objects.filter(owner_id__in=owner_ids)
                .values("owner__username")
                .annotate(n=Count("id"))
                .order_by("owner__username")
            )
            return TemplateResponse(
                request,
                "admin/memory/erase_owners.html",
                {
                    **self.admin_site.each_context(request),
                    "title": "Erase memory",
                    "owners": [(c["owner__username"], c["n"]) for c in counts],
                    "selected": list(queryset.values_list("pk", flat=True)),
                },
            )
        actor = admin_actor(request)
        erased = sum(memory_erase_owner(owner_id=o, actor=actor) for o in owner_ids)
        self.message_user(
            request, f"Erased {erased} items of {len(owner_ids)} users.", messages.SUCCESS
        )
        return None


class EmbeddingEndpointForm(forms.ModelForm):
    base_url = forms.URLField(
        max_length=500, assume_scheme="https", help_text="Up to /v1, e.g. http://host:8000/v1"
    )

    class Meta:
        model = EmbeddingEndpoint
        fields = ("name", "base_url", "model", "dimension", "api_key_env", "timeout_s", "enabled")


@admin.register(EmbeddingEndpoint)
class EmbeddingEndpointAdmin(AuditedAdmin, admin.ModelAdmin):
    form = EmbeddingEndpointForm
    list_display = ("name", "model", "dimension", "base_url", "enabled", "updated_at")
    list_filter = ("enabled",)

    def save_audited(
        self, request: HttpRequest, obj: EmbeddingEndpoint, form: Any, change: bool
    ) -> None:
        embedding_endpoint_save(endpoint=obj)


@admin.register(MemoryOwnerIndex)
class MemoryOwnerIndexAdmin(TenantScopedAdmin, admin.ModelAdmin):
    """Read-only: which large owners have their own search index, and how its build went."""

    list_display = ("owner", "dims", "name", "state", "items_at_build", "build_s", "built_at")
    list_filter = ("state", "dims")
    search_fields = ("owner__username", "name")
    list_select_related = ("owner",)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
