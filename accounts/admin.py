from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.contrib.auth.admin import GroupAdmin, UserAdmin
from django.contrib.auth.models import Group, User
from django.db.models import QuerySet
from django.forms import ModelForm
from django.http import HttpRequest, HttpResponse

from audit.edits import AuditedAdmin, admin_actor
from audit.models import AuditAction
from audit.services import WITHHELD, admin_change_record, audit_record, row_snapshot
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


class AuditedAccessAdmin(AuditedAdmin):
    """Users and groups: who may use the admin and with which permissions is the most
    powerful edit in it (issue 43: every human action on the record). A row's many-to-many
    fields (a user's groups and permissions, a group's permissions) are saved after the row
    (save_related), so the entry is written there, with them; a password is entered as
    changed, never its hash."""

    audit_withheld = frozenset({"password"})
    audit_many: tuple[str, ...] = ()

    def _snapshot(self, obj: Any) -> dict[str, Any]:
        values = row_snapshot(obj, self.audit_withheld)
        values.pop("last_login", None)  # a login is not an edit
        for name in self.audit_many:
            values[name] = sorted(str(related) for related in getattr(obj, name).all())
        return values

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        stored = type(obj)._default_manager.filter(pk=obj.pk).first() if change else None
        form.audit_before = self._snapshot(stored) if stored is not None else None
        self.save_audited(request, obj, form, change)

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        super().save_related(request, form, formsets, change)  # type: ignore[misc]
        admin_change_record(
            actor=admin_actor(request),
            user_id=request.user.pk,
            obj=form.instance,
            before=getattr(form, "audit_before", None),
            after=self._snapshot(form.instance),
            action=AuditAction.ADMIN_CHANGE if change else AuditAction.ADMIN_ADD,
            withheld=self.audit_withheld,
        )

    def _deleted(self, request: HttpRequest, obj: Any) -> None:
        admin_change_record(
            actor=admin_actor(request),
            user_id=request.user.pk,
            obj=obj,
            before=self._snapshot(obj),
            after=None,
            action=AuditAction.ADMIN_DELETE,
            withheld=self.audit_withheld,
        )


admin.site.unregister(User)
admin.site.unregister(Group)


# What makes a user more powerful: only a superuser grants it. Django's own UserAdmin lets
# anyone holding change_user tick is_superuser, or add permissions, on their own row.
GRANTS = ("is_superuser", "is_staff", "groups", "user_permissions")


@admin.register(User)
class AuditedUserAdmin(AuditedAccessAdmin, UserAdmin):
    """Staff who are not superusers, with change_user, edit names, e-mails, passwords and
    is_active of users who are not superusers; grants (superuser, staff, groups,
    permissions) are read-only to them, and a superuser's row is not theirs to reach (its
    password would be theirs to set)."""

    audit_many = ("groups", "user_permissions")

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        fields = tuple(super().get_readonly_fields(request, obj))
        return fields if request.user.is_superuser else (*fields, *GRANTS)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        users = super().get_queryset(request)
        return users if request.user.is_superuser else users.filter(is_superuser=False)

    def user_change_password(
        self, request: HttpRequest, id: str, form_url: str = ""
    ) -> HttpResponse:
        before = self.get_object(request, unquote(id))
        response = super().user_change_password(request, id, form_url)
        after = self.get_object(request, unquote(id))
        if before is not None and after is not None and after.password != before.password:
            audit_record(
                action=AuditAction.ADMIN_CHANGE,
                actor=admin_actor(request),
                user_id=request.user.pk,
                object_type=User._meta.label_lower,
                object_id=after.pk,
                object_repr=str(after),
                before={"password": WITHHELD},
                after={"password": WITHHELD},
            )
        return response


@admin.register(Group)
class AuditedGroupAdmin(AuditedAccessAdmin, GroupAdmin):
    """A group's permissions are granted by a superuser only (a staff user in the group
    with change_group would grant them to themselves)."""

    audit_many = ("permissions",)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        fields = tuple(super().get_readonly_fields(request, obj))
        return fields if request.user.is_superuser else (*fields, "permissions")
