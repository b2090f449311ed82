"""The admin's edits of the platform's configuration, in the audit trail.

A ModelAdmin mixin: each add, change (its change form or a list's editable column) and
delete of a row is one entry with the fields that changed, before and after, written in
the admin's own transaction by the audit service.
"""

from typing import Any

from django.db import transaction
from django.db.models import Model, QuerySet
from django.http import HttpRequest

from .models import AuditAction
from .services import admin_change_record, breaker_reset_record, row_snapshot, stored_snapshot


def admin_actor(request: HttpRequest) -> str:
    return f"admin:{request.user.get_username()}"


class AuditedAdmin:
    """Mix into a ModelAdmin (before admin.ModelAdmin) to audit its adds, changes and deletes."""

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        before = stored_snapshot(type(obj), obj.pk) if change and obj.pk is not None else None
        super().save_model(request, obj, form, change)  # type: ignore[misc]
        admin_change_record(
            actor=admin_actor(request),
            user_id=request.user.pk,
            obj=obj,
            before=before,
            after=row_snapshot(obj),
            action=AuditAction.ADMIN_CHANGE if change else AuditAction.ADMIN_ADD,
        )

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        self._deleted(request, obj)
        super().delete_model(request, obj)  # type: ignore[misc]

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        with transaction.atomic():
            for obj in queryset:
                self._deleted(request, obj)
            super().delete_queryset(request, queryset)  # type: ignore[misc]

    def _deleted(self, request: HttpRequest, obj: Model) -> None:
        admin_change_record(
            actor=admin_actor(request),
            user_id=request.user.pk,
            obj=obj,
            before=row_snapshot(obj),
            after=None,
            action=AuditAction.ADMIN_DELETE,
        )


def breaker_reset_audit(request: HttpRequest, obj: Model, state: str) -> None:
    """The admin reset `obj`'s circuit breaker, which was `state`."""
    breaker_reset_record(actor=admin_actor(request), user_id=request.user.pk, obj=obj, state=state)
