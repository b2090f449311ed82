"""Who may grant power in the admin (issue 43: least privilege for staff, every human action
on the record): only a superuser makes a user a superuser or staff, or gives users and
groups permissions; a staff user holding change_user cannot reach a superuser's row (nor
set its password); every edit of users and groups, their permissions and a password set by
an operator is an audit entry."""

from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client
from django.urls import reverse

from audit.models import AuditEntry
from tests.factories import StaffUserFactory, UserFactory, permissions

pytestmark = pytest.mark.django_db

USER_PERMS = ["auth.view_user", "auth.change_user", "auth.view_group", "auth.change_group"]


def _client(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _user_form(client: Client, user: User, **changes: Any) -> dict[str, Any]:
    page = client.get(reverse("admin:auth_user_change", args=[user.pk]))
    assert page.status_code == 200
    form = page.context["adminform"].form
    data: dict[str, Any] = {}
    for name, value in form.initial.items():
        if name not in form.fields or value is None or name == "password":
            continue
        if name in ("date_joined", "last_login"):
            data[f"{name}_0"], data[f"{name}_1"] = value.strftime("%Y-%m-%d %H:%M:%S").split()
        elif isinstance(value, bool):
            if value:
                data[name] = "on"
        elif isinstance(value, list):
            data[name] = [getattr(v, "pk", v) for v in value]
        else:
            data[name] = value
    data.update(changes)
    return {k: v for k, v in data.items() if v is not False}


def test_a_staff_user_with_change_user_grants_themselves_nothing() -> None:
    staff = StaffUserFactory(username="climber", perms=USER_PERMS)
    client = _client(staff)
    everything = [p.pk for p in permissions("auth.add_user", "tools.change_mcpserver")]
    response = client.post(
        reverse("admin:auth_user_change", args=[staff.pk]),
        _user_form(
            client, staff, is_superuser="on", user_permissions=everything, first_name="Clim"
        ),
    )
    assert response.status_code == 302, response.content.decode()[:3000]
    staff.refresh_from_db()
    assert staff.first_name == "Clim"  # the edit went through, the grants did not
    assert not staff.is_superuser
    assert set(staff.user_permissions.values_list("codename", flat=True)) == {
        p.split(".")[1] for p in USER_PERMS
    }
    # Nor through a group they belong to.
    group = Group.objects.create(name="ops")
    staff.groups.add(group)
    client.post(
        reverse("admin:auth_group_change", args=[group.pk]),
        {"name": "ops", "permissions": everything},
    )
    assert not group.permissions.exists()


def test_a_staff_user_cannot_reach_a_superusers_row_or_set_its_password() -> None:
    root = UserFactory(username="root", is_staff=True, is_superuser=True)
    root.set_password("the-roots-own")
    root.save()
    client = _client(StaffUserFactory(username="climber", perms=USER_PERMS))

    assert client.get(reverse("admin:auth_user_change", args=[root.pk])).status_code == 302
    assert "root" not in client.get(reverse("admin:auth_user_changelist")).content.decode()
    client.post(
        reverse("admin:auth_user_password_change", args=[root.pk]),
        {"password1": "Taken-0ver-pw!", "password2": "Taken-0ver-pw!"},
    )
    root.refresh_from_db()
    assert root.check_password("the-roots-own")


def test_a_superusers_grants_and_a_password_set_are_audit_entries() -> None:
    root = UserFactory(username="root", is_staff=True, is_superuser=True)
    client = _client(root)
    member = StaffUserFactory(username="member")
    grant = permissions("tools.change_mcpserver")[0]

    response = client.post(
        reverse("admin:auth_user_change", args=[member.pk]),
        _user_form(client, member, user_permissions=[grant.pk]),
    )
    assert response.status_code == 302, response.content.decode()[:3000]
    client.post(
        reverse("admin:auth_user_password_change", args=[member.pk]),
        {"password1": "N3w-password-x!", "password2": "N3w-password-x!"},
    )
    client.post(reverse("admin:auth_group_add"), {"name": "mcp", "permissions": [grant.pk]})

    entries = AuditEntry.objects.filter(object_type__in=["auth.user", "auth.group"]).order_by("id")
    assert [(e.action, e.actor, e.object_repr) for e in entries] == [
        ("admin.change", "admin:root", "member"),
        ("admin.change", "admin:root", "member"),
        ("admin.add", "admin:root", "mcp"),
    ]
    granted, password, group = entries
    # (The form's date_joined to the second differs too: this test's own form, not a grant.)
    assert (granted.before["user_permissions"], granted.after["user_permissions"]) == (
        [],
        [str(grant)],
    )
    assert password.before == password.after == {"password": "(withheld)"}
    assert group.after["permissions"] == [str(grant)]
    assert "pbkdf2" not in str([e.before for e in entries] + [e.after for e in entries])
