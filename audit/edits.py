"""The admin's edits of the platform's configuration (and of a tenant's rows: API keys,
budgets, memory items), in the audit trail.

A ModelAdmin mixin: each add, change (its change form or a list's editable column) and
delete of a row is one entry with the fields that changed, before and after, written in
the admin's own transaction by the audit service. A row with an owner is entered as that
tenant's (its staff see the entry); `audit_withheld` fields are entered as changed without
their values (what a person said).
"""

from typing import Any

from django.db import transaction
from django.db.models import Model, QuerySet
from django.http import HttpRequest

from .models import AuditAction
from .services import admin_change_record, breaker_reset_record, row_snapshot, stored_snapshot


def admin_actor(request: HttpRequest) -> str:
    return f"admin:{request.user.get_username()}"


def _owner_id(obj: Model) -> int | None:
    owner_id = getattr(obj, "owner_id", None)
    return owner_id if isinstance(owner_id, int) else None


class AuditedAdmin:
    """Mix into a ModelAdmin (before admin.ModelAdmin) to audit its adds, changes and deletes.
    An admin that saves through a service overrides `save_audited`, not `save_model`."""

    audit_withheld: frozenset[str] = frozenset()

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        withheld = self.audit_withheld
        before = (
            stored_snapshot(type(obj), obj.pk, withheld) if change and obj.pk is not None else None
        )
        self.save_audited(request, obj, form, change)
        admin_change_record(
            actor=admin_actor(request),
            user_id=request.user.pk,
            obj=obj,
            before=before,
            after=row_snapshot(obj, withheld),
            action=AuditAction.ADMIN_CHANGE if change else AuditAction.ADMIN_ADD,
            owner_id=_owner_id(obj),
            withheld=self.audit_withheld,
        )

    def save_audited(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        """The save itself (the ModelAdmin's, unless overridden)."""
        super().save_model(request, obj, form, change)  # type: ignore[misc]

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
            before=row_snapshot(obj, self.audit_withheld),
            after=None,
            action=AuditAction.ADMIN_DELETE,
            owner_id=_owner_id(obj),
            withheld=self.audit_withheld,
        )


def breaker_reset_audit(request: HttpRequest, obj: Model, state: str) -> None:
    """The admin reset `obj`'s circuit breaker, which was `state`."""
    breaker_reset_record(actor=admin_actor(request), user_id=request.user.pk, obj=obj, state=state)
