import pytest

from audit.selectors import admin_changed_fields, audit_entries_visible
from audit.services import audit_record
from tests.factories import StaffUserFactory, UserFactory

pytestmark = pytest.mark.django_db


def test_a_staff_user_sees_their_tenants_entries_and_their_own_actions_only():
    ann, bob = StaffUserFactory(username="ann"), StaffUserFactory(username="bob")
    root = UserFactory(username="root", is_superuser=True, is_staff=True)
    about_ann = audit_record(
        action="credits.grant", actor="system", object_type="a.b", object_id=1, owner_id=ann.pk
    )
    by_ann = audit_record(
        action="admin.change", actor="admin:ann", object_type="tools.tool", object_id=2
    )
    about_bob = audit_record(
        action="credits.grant", actor="system", object_type="a.b", object_id=3, owner_id=bob.pk
    )
    platform = audit_record(
        action="admin.change", actor="admin:root", object_type="tools.tool", object_id=4
    )
    assert set(audit_entries_visible(user=ann)) == {about_ann, by_ann}
    assert set(audit_entries_visible(user=root)) == {about_ann, by_ann, about_bob, platform}
    assert not audit_entries_visible(user=None).exists()


def test_the_fields_the_admin_changed_name_their_latest_entry():
    first = audit_record(
        action="admin.change",
        actor="admin:a",
        object_type="tools.tool",
        object_id=1,
        before={"risk_level": None},
        after={"risk_level": 3},
    )
    later = audit_record(
        action="admin.change",
        actor="admin:b",
        object_type="tools.tool",
        object_id=1,
        before={"parameters.properties.x": 1},
        after={"parameters.properties.x": 2, "risk_level": 2},
    )
    audit_record(
        action="admin.change",
        actor="admin:c",
        object_type="tools.tool",
        object_id=9,
        after={"enabled": False},
    )
    found = admin_changed_fields(object_type="tools.tool", object_id=1)
    assert found == {"risk_level": later, "parameters": later}
    assert first.pk < later.pk
