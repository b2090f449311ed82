from django.contrib import admin

from .models import ApiKey


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ("prefix", "name", "owner", "roles", "is_active", "created_at", "last_used_at")
    list_filter = ("is_active",)
    search_fields = ("prefix", "name", "owner__username")
    readonly_fields = ("prefix", "key_hash", "created_at", "last_used_at")
    fields = ("owner", "name", "roles", "is_active", "prefix", "key_hash", "created_at", "last_used_at")

    def has_add_permission(self, request) -> bool:  # type: ignore[no-untyped-def]
        # A key must be shown exactly once; the create_api_key command does that.
        return False
