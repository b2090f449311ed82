"""The audit trail's admin page: read-only, filterable, scoped to the tenant, content masked."""

import pytest
from django.test import Client
from django.urls import reverse

from audit.models import AuditEntry
from audit.services import audit_record
from tests.factories import StaffUserFactory, UserFactory, permissions

pytestmark = pytest.mark.django_db

LIST = "admin:audit_auditentry_changelist"


def _client(user) -> Client:  # type: ignore[no-untyped-def]
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def entries():  # type: ignore[no-untyped-def]
    ann = StaffUserFactory(username="ann", perms=["audit.view_auditentry"])
    bob = UserFactory(username="bob")
    made = {
        "grant": audit_record(action="credits.grant", actor="admin:root", object_type="billing.creditaccount",
                              object_id=1, owner_id=ann.pk, before={"balance": 0}, after={"balance": 5}),
        "edit": audit_record(action="approval.edited", actor="admin:carol", object_type="approvals.approval",
                             object_id="0b6f0b6f-0000-4000-8000-000000000001", owner_id=ann.pk,
                             before={"arguments.amount": 80}, after={"arguments.amount": 20},
                             reason="too much"),
        "tool": audit_record(action="admin.change", actor="admin:root", object_type="tools.tool",
                             object_id=3, object_repr="refund", before={"risk_level": None},
                             after={"risk_level": 3}),
        "other": audit_record(action="credits.grant", actor="system", object_type="billing.creditaccount",
                              object_id=2, owner_id=bob.pk),
    }  # fmt: skip
    return ann, made


def test_the_list_filters_by_action_actor_object_type_and_date(entries):
    root = UserFactory(username="root", is_staff=True, is_superuser=True)
    client = _client(root)
    url = reverse(LIST)
    page = client.get(url).content.decode()
    for label in ("By actor", "By action", "By object type", "By date"):
        assert label in page
    assert "credits.grant" in page and "tool refund" in page
    assert "Audit trail</a>\n&rsaquo; Audit entries" in page and "4 audit entries" in page
    only = client.get(url, {"action__exact": "approval.edited"}).context["cl"].result_list
    assert [e.action for e in only] == ["approval.edited"]
    by_actor = client.get(url, {"actor": "system"}).context["cl"].result_list
    assert [e.actor for e in by_actor] == ["system"]
    by_type = client.get(url, {"object_type": "tools.tool"}).context["cl"].result_list
    assert [e.object_type for e in by_type] == ["tools.tool"]
    assert client.get(url, {"q": "carol"}).context["cl"].result_count == 1
    today = entries[1]["grant"].at
    dated = client.get(
        url, {"at__year": today.year, "at__month": today.month, "at__day": today.day}
    )
    assert dated.context["cl"].result_count == 4


def test_it_is_read_only_even_for_a_superuser(entries):
    root = UserFactory(username="root", is_staff=True, is_superuser=True)
    client = _client(root)
    entry = entries[1]["tool"]
    assert client.get(reverse("admin:audit_auditentry_add")).status_code == 403
    change = reverse("admin:audit_auditentry_change", args=[entry.pk])
    page = client.get(change)
    assert page.status_code == 200 and 'name="_save"' not in page.content.decode()
    client.post(change, {"actor": "someone else"})
    delete = reverse("admin:audit_auditentry_delete", args=[entry.pk])
    assert client.post(delete, {"post": "yes"}).status_code == 403
    assert AuditEntry.objects.get(pk=entry.pk).actor == "admin:root"
    assert client.get(reverse(LIST)).context["cl"].model_admin.get_actions(page.wsgi_request) == {}


def test_a_staff_user_sees_their_tenant_and_the_content_only_with_its_permission(entries):
    ann, made = entries
    client = _client(ann)
    listed = {e.pk for e in client.get(reverse(LIST)).context["cl"].result_list}
    assert listed == {made["grant"].pk, made["edit"].pk}
    edit = reverse("admin:audit_auditentry_change", args=[made["edit"].pk])
    page = client.get(edit).content.decode()
    assert "too much" in page and "arguments.amount" not in page and "hidden" in page
    grant = client.get(reverse("admin:audit_auditentry_change", args=[made["grant"].pk]))
    assert "balance" in grant.content.decode()  # not what anyone said: shown
    assert (
        client.get(reverse("admin:audit_auditentry_change", args=[made["other"].pk])).status_code
        == 302
    )

    ann.user_permissions.add(*permissions("agent_sessions.view_message_content"))
    page = _client(ann).get(edit).content.decode()
    assert "arguments.amount" in page and "80" in page and "20" in page


def test_an_entry_links_to_its_object(entries):
    root = UserFactory(username="root", is_staff=True, is_superuser=True)
    page = _client(root).get(reverse(LIST)).content.decode()
    assert reverse("admin:tools_tool_change", args=[3]) in page
    assert reverse("admin:billing_creditaccount_change", args=[1]) in page
