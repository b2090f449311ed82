from django.contrib import admin, messages
from django.db.models import QuerySet
from django.forms import ModelForm
from django.http import HttpRequest

from audit.edits import AuditedAdmin, admin_actor
from tools.models import Tool

from .admin_access import holds
from .models import ApiKey, Approver, Role
from .services import api_key_revoke
from .tenancy import TenantScopedAdmin


@admin.register(ApiKey)
class ApiKeyAdmin(AuditedAdmin, TenantScopedAdmin, admin.ModelAdmin):
    list_display = (
        "prefix",
        "name",
        "owner",
        "roles",
        "max_value",
        "is_active",
        "created_at",
        "last_used_at",
    )
    list_filter = ("is_active",)
    search_fields = ("prefix", "name", "owner__username")
    readonly_fields = ("prefix", "key_hash", "created_at", "last_used_at")
    fields = (
        "owner",
        "name",
        "roles",
        "max_value",
        "is_active",
        "prefix",
        "key_hash",
        "created_at",
        "last_used_at",
    )

    def has_add_permission(self, request) -> bool:  # type: ignore[no-untyped-def]
        # A key must be shown exactly once; the create_api_key command does that.
        return False

    actions = ["revoke_keys"]

    def has_revoke_permission(self, request: HttpRequest) -> bool:
        return holds(request, "accounts.revoke_apikey")

    def get_readonly_fields(self, request: HttpRequest, obj: ApiKey | None = None) -> list[str]:
        fields = [*super().get_readonly_fields(request, obj), "owner"]
        # A key never moves to another owner (it would act as them). Unticking "is active"
        # revokes, so only who may revoke sees it as a box.
        if not self.has_revoke_permission(request):
            fields.append("is_active")
        return fields

    def save_model(self, request: HttpRequest, obj: ApiKey, form: ModelForm, change: bool) -> None:
        # Unticking "is active" is a revocation: it goes through the service, which
        # also closes the key's open websockets and enters it in the audit trail (the
        # other fields' edits are entered as an admin change).
        revoking = change and "is_active" in form.changed_data and not obj.is_active
        if revoking:
            obj.is_active = True
        super().save_model(request, obj, form, change)
        if revoking:
            api_key_revoke(api_key=obj, actor=admin_actor(request))

    @admin.action(
        description="Revoke selected keys (closes their websockets)", permissions=["revoke"]
    )
    def revoke_keys(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        revoked = sum(api_key_revoke(api_key=key, actor=admin_actor(request)) for key in queryset)
        self.message_user(request, f"Revoked {revoked} key(s).", messages.SUCCESS)


@admin.register(Role)
class RoleAdmin(AuditedAdmin, admin.ModelAdmin):
    """Which tools each role reaches; edit a tool's roles on the tool's page."""

    list_display = ("name", "description", "tools_reached")
    search_fields = ("name", "description")
    readonly_fields = ("tools_reached",)

    @admin.display(description="tools this role may use")
    def tools_reached(self, obj: Role) -> str:
        names = [
            t.name
            for t in Tool.objects.filter(enabled=True).only("name", "roles")
            if not t.roles or obj.name in t.roles
        ]
        return ", ".join(names) or "none"


@admin.register(Approver)
class ApproverAdmin(AuditedAdmin, admin.ModelAdmin):
    """Users whose keys may decide approvals; `groups` are what tools escalate to."""

    list_display = ("user", "groups", "is_active", "created_at")
    list_filter = ("is_active",)
    search_fields = ("user__username",)
    # Searched, not a list of every user (the search needs auth.view_user).
    autocomplete_fields = ("user",)
