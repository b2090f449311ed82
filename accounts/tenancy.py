"""Tenant isolation in the operators' console: a tenant is an owner (the user an API key
belongs to). A superuser operates the whole platform; a staff user who is not one sees
and acts on only their own tenant's records, whatever model permissions they hold.
(Approvers act through the approvals queue, routed by their approver groups.)"""

from typing import Any, TypeVar

from django.db.models import Model, QuerySet
from django.http import HttpRequest

M = TypeVar("M", bound=Model)


def tenant_scope(queryset: QuerySet[M], user: Any, owner_path: str) -> QuerySet[M]:
    """`queryset` as `user` may see it: all for a superuser, else rows whose
    `owner_path` (e.g. "owner", "session__owner") is the user."""
    if getattr(user, "is_superuser", False):
        return queryset
    if user is None or not getattr(user, "is_authenticated", False):
        return queryset.none()
    return queryset.filter(**{owner_path: user})


class TenantScopedAdmin:
    """A ModelAdmin mixin: list, change, history and delete pages only reach the rows
    of the staff user's own tenant (unless a superuser), and a row they add or edit can
    name no other owner (their memory item would reach another tenant's prompts, their
    budget stop another tenant's runs)."""

    tenant_owner_path = "owner"

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        queryset = super().get_queryset(request)  # type: ignore[misc]
        return tenant_scope(queryset, request.user, self.tenant_owner_path)

    def formfield_for_foreignkey(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        if db_field.name == self.tenant_owner_path:
            users = db_field.remote_field.model._default_manager.all()
            if not getattr(request.user, "is_superuser", False):
                users = users.filter(pk=request.user.pk)
            kwargs["queryset"] = users
        return super().formfield_for_foreignkey(db_field, request, **kwargs)  # type: ignore[misc]
