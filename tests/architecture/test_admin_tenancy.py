"""Tenancy everywhere (issue 43): every admin page over rows that belong to a tenant (a
foreign key to a user or a session, or a session's id) is tenant-scoped, so a staff user who
is not a superuser reaches only their own tenant's rows. A page registered later is walked
too: the evaluations, schedules, deliveries and credit pools pages came after the tenancy
work, and the evaluations' was not scoped."""

import pytest
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.test import RequestFactory

from accounts.tenancy import TenantScopedAdmin
from record.models import Session
from tests.factories import StaffUserFactory, permissions

pytestmark = pytest.mark.django_db

# model -> how its rows are kept from other tenants without TenantScopedAdmin.
REVIEWED = {
    "billing.usagedaily": "the cost page compares tenants: superusers only",
    "audit.auditentry": "audit.selectors scope it (a tenant's entries and the user's own)",
}


def _tenant_rows(model: type) -> list[str]:
    tenant_models = (get_user_model(), Session)
    return [
        field.name
        for field in model._meta.concrete_fields
        if (field.many_to_one and field.related_model in tenant_models)
        or field.name == "session_id"
    ]


def test_every_admin_page_over_a_tenants_rows_is_tenant_scoped() -> None:
    unscoped = {
        model._meta.label_lower: fields
        for model, model_admin in admin.site._registry.items()
        if (fields := _tenant_rows(model))
        and not isinstance(model_admin, TenantScopedAdmin)
        and model._meta.label_lower not in REVIEWED
    }
    assert unscoped == {}


def test_the_cost_page_is_a_superusers_even_for_staff_holding_its_permission() -> None:
    from billing.models import UsageDaily

    staff = StaffUserFactory(perms=["billing.view_usagedaily"])
    request = RequestFactory().get("/admin/")
    request.user = get_user_model().objects.get(pk=staff.pk)
    model_admin = admin.site._registry[UsageDaily]
    assert not model_admin.has_view_permission(request)
    assert permissions("billing.view_usagedaily")  # the permission exists; it is not enough
