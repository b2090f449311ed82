from django.contrib import admin

from tools.models import Tool

from .models import ApiKey, Role


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ("prefix", "name", "owner", "roles", "is_active", "created_at", "last_used_at")
    list_filter = ("is_active",)
    search_fields = ("prefix", "name", "owner__username")
    readonly_fields = ("prefix", "key_hash", "created_at", "last_used_at")
    fields = (
        "owner",
        "name",
        "roles",
        "is_active",
        "prefix",
        "key_hash",
        "created_at",
        "last_used_at",
    )

    def has_add_permission(self, request) -> bool:  # type: ignore[no-untyped-def]
        # A key must be shown exactly once; the create_api_key command does that.
        return False


@admin.register(Role)
class RoleAdmin(admin.ModelAdmin):
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
