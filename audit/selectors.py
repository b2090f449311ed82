"""Reads of the audit trail."""

from typing import Any

from django.db.models import Q, QuerySet

from .models import AuditEntry


def audit_entries_visible(*, user: Any) -> QuerySet[AuditEntry]:
    """The entries a staff user may read: all for a superuser; else those about their own
    tenant's objects and those they made themselves."""
    rows = AuditEntry.objects.all()
    if getattr(user, "is_superuser", False):
        return rows
    if user is None or not getattr(user, "is_authenticated", False):
        return rows.none()
    return rows.filter(Q(owner=user) | Q(user=user))


def audit_entries_for(*, object_type: str, object_id: Any) -> QuerySet[AuditEntry]:
    """One object's entries, newest first."""
    return AuditEntry.objects.filter(object_type=object_type, object_id=str(object_id))


def admin_changed_fields(*, object_type: str, object_id: Any) -> dict[str, AuditEntry]:
    """For each field the admin has changed on this object: its latest change's entry."""
    latest: dict[str, AuditEntry] = {}
    for entry in audit_entries_for(object_type=object_type, object_id=object_id).filter(
        action="admin.change"
    ):
        for path in entry.after or {}:
            latest.setdefault(path.split(".", 1)[0], entry)
    return latest
