"""Admin of approvals: look up any approval and its history; decide pending ones.

The full approver queue page (filters, takeover) is a later piece of work; these
actions go through the same service as the REST API.
"""

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from accounts.selectors import approver_groups
from sessions import services
from sessions.errors import DomainError

from .models import Approval, ApprovalTransition


class ApprovalTransitionInline(admin.TabularInline):
    model = ApprovalTransition
    extra = 0
    can_delete = False
    fields = ("at", "outcome", "from_status", "to_status", "actor", "group", "comment", "arguments")
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(Approval)
class ApprovalAdmin(admin.ModelAdmin):
    list_display = (
        "tool_name",
        "status",
        "risk_level",
        "group",
        "session",
        "requested_at",
        "deadline",
        "decided_by_name",
    )
    list_filter = ("status", "kind", "group", "tool_name")
    search_fields = ("tool_name", "session__id", "decided_by_name")
    readonly_fields = tuple(f.name for f in Approval._meta.fields)
    inlines = [ApprovalTransitionInline]
    actions = ["approve", "approve_and_remember", "reject"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def _decide(
        self, request: HttpRequest, queryset: QuerySet[Approval], *, approve: bool, remember: bool
    ) -> None:
        user_id = request.user.pk
        groups = (approver_groups(user_id=user_id) or []) if user_id is not None else []
        done = 0
        for approval in queryset:
            allowed = [approval.group] if request.user.is_superuser else groups
            try:
                services.approval_decide(
                    approval_id=approval.pk,
                    approve=approve,
                    user=request.user,  # type: ignore[arg-type]
                    groups=allowed,
                    comment="" if approve else f"rejected in the admin by {request.user}",
                    remember=remember,
                )
                done += 1
            except DomainError as exc:
                self.message_user(request, f"{approval}: {exc.message}", messages.WARNING)
        self.message_user(request, f"Decided {done} approval(s).", messages.SUCCESS)

    @admin.action(description="Approve")
    def approve(self, request: HttpRequest, queryset: QuerySet[Approval]) -> None:
        self._decide(request, queryset, approve=True, remember=False)

    @admin.action(description="Approve and remember for the session (same tool and arguments)")
    def approve_and_remember(self, request: HttpRequest, queryset: QuerySet[Approval]) -> None:
        self._decide(request, queryset, approve=True, remember=True)

    @admin.action(description="Reject")
    def reject(self, request: HttpRequest, queryset: QuerySet[Approval]) -> None:
        self._decide(request, queryset, approve=False, remember=False)
