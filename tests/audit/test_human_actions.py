"""Issue 46: human actions that left no audit row. API keys issued and revoked (by the
commands and in the admin), approver rights granted, memory erased (never what it said),
and the admin's edits of keys, roles, approvers, memory items and embedding endpoints:
each one entry with actor, time and before/after, seen by the tenant's staff."""

import io

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from accounts.models import ApiKey, Approver, Role
from accounts.services import api_key_create, api_key_revoke
from audit.models import AuditEntry
from audit.services import WITHHELD
from memory.models import EmbeddingEndpoint, MemoryItem, MemoryVersion
from memory.services import memory_erase_owner
from tests.factories import StaffUserFactory, UserFactory

pytestmark = pytest.mark.django_db(transaction=True)

PIN = "My PIN is 4711"


@pytest.fixture(autouse=True)
def _own_redis_prefix(settings) -> None:  # type: ignore[no-untyped-def]
    import uuid

    settings.REDIS_KEY_PREFIX = f"test-audit-human-{uuid.uuid4().hex}"


def _only(action: str) -> AuditEntry:
    [entry] = AuditEntry.objects.filter(action=action)
    return entry


def _login(user) -> Client:  # type: ignore[no-untyped-def]
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def root() -> Client:
    return _login(get_user_model().objects.create_superuser("root", "root@example.com", "pw"))


def _command(name: str, *args: str) -> str:
    out = io.StringIO()
    call_command(name, *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


# --- API keys -------------------------------------------------------------------------


def test_a_key_issued_by_the_command_is_an_entry_by_the_os_user(monkeypatch):
    monkeypatch.setenv("SUDO_USER", "ops-anna")
    raw = _command("create_api_key", "--user", "alice", "--roles", "support", "--name", "ci")
    raw = raw.strip()
    entry = _only("apikey.create")
    key = ApiKey.objects.get()
    assert (entry.actor, entry.object_type, entry.object_id) == (
        "cli:ops-anna", "accounts.apikey", str(key.pk),
    )  # fmt: skip
    assert entry.owner_id == key.owner_id and entry.before is None
    assert entry.after == {
        "name": "ci", "prefix": key.prefix, "roles": ["support"], "max_value": None,
        "is_active": True,
    }  # fmt: skip
    assert entry.data == {"user_created": True, "roles_created": ["support"]}
    # Neither the key nor its hash is in the trail.
    stored = str(entry.after) + str(entry.data) + entry.object_repr
    assert raw not in stored and key.key_hash not in stored


def test_the_commands_actor_option_and_an_approver_grant():
    _command(
        "create_api_key", "--user", "bob", "--approver", "--approver-groups", "refunds",
        "--actor", "ci:release-42",
    )  # fmt: skip
    assert _only("apikey.create").actor == "ci:release-42"
    grant = _only("approver.grant")
    assert grant.actor == "ci:release-42" and grant.before is None
    assert grant.after == {"groups": ["refunds"], "is_active": True}
    assert grant.object_id == str(Approver.objects.get(user__username="bob").pk)
    assert grant.owner_id == get_user_model().objects.get(username="bob").pk


def test_a_key_revoked_by_the_command_is_an_entry_once(monkeypatch):
    monkeypatch.setenv("SUDO_USER", "ops-anna")
    issued = api_key_create(username="alice", roles=[])
    _command("revoke_api_key", issued.api_key.prefix)
    entry = _only("apikey.revoke")
    assert entry.actor == "cli:ops-anna" and entry.object_id == str(issued.api_key.pk)
    assert (entry.before, entry.after) == ({"is_active": True}, {"is_active": False})
    assert entry.owner_id == issued.api_key.owner_id
    # Revoking it again changes nothing and enters nothing.
    assert "already revoked" in _command("revoke_api_key", issued.api_key.prefix)
    assert AuditEntry.objects.filter(action="apikey.revoke").count() == 1
    # Every key of a user, with --actor.
    api_key_create(username="bob", roles=[])
    api_key_create(username="bob", roles=[])
    _command("revoke_api_key", "--user", "bob", "--actor", "security:incident-7")
    assert list(
        AuditEntry.objects.filter(action="apikey.revoke", actor="security:incident-7")
        .order_by("object_id")
        .values_list("object_id", flat=True)
    ) == [
        str(k)
        for k in ApiKey.objects.filter(owner__username="bob")
        .order_by("pk")
        .values_list("pk", flat=True)
    ]


def test_a_revocation_that_rolls_back_leaves_no_entry():
    from django.db import transaction

    key = api_key_create(username="alice", roles=[]).api_key
    with pytest.raises(RuntimeError), transaction.atomic():
        api_key_revoke(api_key=key, actor="admin:x")
        raise RuntimeError("the caller failed after the revocation")
    assert not AuditEntry.objects.filter(action="apikey.revoke").exists()
    assert ApiKey.objects.get(pk=key.pk).is_active


def test_revocations_and_edits_of_keys_in_the_admin(root):
    keys = [
        api_key_create(username="carol", roles=["support"], name=f"k{i}").api_key for i in range(3)
    ]
    changelist = reverse("admin:accounts_apikey_changelist")
    root.post(
        changelist,
        {"action": "revoke_keys", "_selected_action": [keys[0].pk, keys[1].pk], "index": 0},
    )
    revoked = AuditEntry.objects.filter(action="apikey.revoke").order_by("object_id")
    assert [e.object_id for e in revoked] == [str(keys[0].pk), str(keys[1].pk)]
    assert {(e.actor, e.user_id) for e in revoked} == {
        ("admin:root", get_user_model().objects.get(username="root").pk)
    }
    # The change form: a new name and roles, and "is active" unticked (a revocation).
    change = reverse("admin:accounts_apikey_change", args=[keys[2].pk])
    response = root.post(change, {"name": "renamed", "roles": "support,analyst", "max_value": ""})
    assert response.status_code == 302
    edit = _only("admin.change")
    assert edit.object_type == "accounts.apikey" and edit.actor == "admin:root"
    assert edit.before == {"name": "k2", "roles": ["support"]}
    assert edit.after == {"name": "renamed", "roles": ["support", "analyst"]}
    assert edit.owner_id == keys[2].owner_id
    assert AuditEntry.objects.filter(action="apikey.revoke", object_id=str(keys[2].pk)).exists()
    # A key deleted: what it was, but never its hash.
    delete = reverse("admin:accounts_apikey_delete", args=[keys[0].pk])
    assert root.post(delete, {"post": "yes"}).status_code == 302
    deleted = _only("admin.delete")
    assert deleted.before["prefix"] == keys[0].prefix and deleted.owner_id == keys[0].owner_id
    every = str(list(AuditEntry.objects.values_list("before", "after", "data")))
    assert "key_hash" not in every and keys[0].key_hash not in every


def test_roles_and_approvers_edited_in_the_admin(root):
    add = reverse("admin:accounts_role_add")
    assert root.post(add, {"name": "billing", "description": "Invoices"}).status_code == 302
    added = _only("admin.add")
    assert added.object_type == "accounts.role" and added.after["name"] == "billing"
    user = UserFactory(username="dora")
    approver = Approver.objects.create(user=user, groups=["approvers"])
    change = reverse("admin:accounts_approver_change", args=[approver.pk])
    response = root.post(change, {"user": user.pk, "groups": "approvers,refunds", "is_active": ""})
    assert response.status_code == 302, response.content.decode()[:2000]
    edit = AuditEntry.objects.get(action="admin.change", object_type="accounts.approver")
    assert edit.before == {"groups": ["approvers"], "is_active": True}
    assert edit.after == {"groups": ["approvers", "refunds"], "is_active": False}
    assert Role.objects.filter(name="billing").exists()


# --- Memory ---------------------------------------------------------------------------


def _remembered(owner) -> MemoryItem:  # type: ignore[no-untyped-def]
    item = MemoryItem.objects.create(owner=owner, tag="fact", subject="pin", content=PIN)
    MemoryVersion.objects.create(
        item=item, owner=owner, action="created", content=PIN, actor="tool"
    )
    return item


def test_an_erasure_is_an_entry_with_counts_never_what_was_remembered():
    owner = UserFactory(username="erin")
    _remembered(owner)
    MemoryItem.objects.create(owner=owner, tag="preference", subject="tea", content="likes tea")
    assert memory_erase_owner(owner_id=owner.pk, actor="admin:dpo") == 2
    entry = _only("memory.erase")
    assert (entry.actor, entry.object_type, entry.object_id, entry.object_repr) == (
        "admin:dpo", "auth.user", str(owner.pk), "erin",
    )  # fmt: skip
    assert entry.owner_id == owner.pk
    assert entry.before == {"items": 2, "versions": 1, "indexes": 0}
    assert entry.after == {"items": 0, "versions": 0, "indexes": 0}
    every = str(list(AuditEntry.objects.values_list("before", "after", "data", "object_repr")))
    assert "PIN" not in every and "tea" not in every


def test_an_erasure_in_the_admin_names_the_operator(root):
    owner = UserFactory(username="fred")
    item = _remembered(owner)
    changelist = reverse("admin:memory_memoryitem_changelist")
    root.post(
        changelist,
        {"action": "erase_owners", "_selected_action": [item.pk], "index": 0, "confirm": "yes"},
    )
    assert not MemoryItem.objects.filter(owner=owner).exists()
    entry = _only("memory.erase")
    assert entry.actor == "admin:root" and entry.object_id == str(owner.pk)
    assert entry.before["items"] == 1


def test_a_memory_item_edited_and_deleted_in_the_admin_keeps_no_text(root, monkeypatch):
    # The edit embeds the new text: a vector of our own, no embeddings server.
    monkeypatch.setattr("memory.services.embed_texts", lambda *a: [[0.0] * 16])
    monkeypatch.setattr(
        "memory.services.current_embedder",
        lambda: type("Embedder", (), {"dimension": 16, "model": "m"})(),
    )
    owner = UserFactory(username="gina")
    item = _remembered(owner)
    change = reverse("admin:memory_memoryitem_change", args=[item.pk])
    form = {"tag": "fact", "subject": "pin", "content": "My PIN is 0000", "importance": 0.5,
            "confidence": 0.9}  # fmt: skip
    response = root.post(change, form)
    assert response.status_code == 302, response.content.decode()[:2000]
    edit = _only("admin.change")
    assert edit.object_type == "memory.memoryitem" and edit.owner_id == owner.pk
    assert edit.before["content"] == WITHHELD and edit.after["content"] == WITHHELD
    assert "subject" not in edit.after  # unchanged: not entered
    delete = reverse("admin:memory_memoryitem_delete", args=[item.pk])
    assert root.post(delete, {"post": "yes"}).status_code == 302
    deleted = _only("admin.delete")
    assert deleted.before["content"] == WITHHELD and deleted.before["subject"] == WITHHELD
    assert deleted.owner_id == owner.pk
    every = str(list(AuditEntry.objects.values_list("before", "after", "object_repr")))
    assert "0000" not in every and "4711" not in every and "'pin'" not in every


def test_an_embedding_endpoint_edited_in_the_admin(root):
    endpoint = EmbeddingEndpoint.objects.create(
        name="vec", base_url="http://127.0.0.1:9/v1", model="m", dimension=16
    )
    change = reverse("admin:memory_embeddingendpoint_change", args=[endpoint.pk])
    form = {"name": "vec", "base_url": "http://elsewhere.example/v1", "model": "m",
            "dimension": 16, "api_key_env": "", "timeout_s": 10, "enabled": "on"}  # fmt: skip
    response = root.post(change, form)
    assert response.status_code == 302, response.content.decode()[:2000]
    edit = _only("admin.change")
    assert edit.before == {"base_url": "http://127.0.0.1:9/v1"}
    assert edit.after == {"base_url": "http://elsewhere.example/v1"}


# --- Who sees the entries -------------------------------------------------------------


def test_a_tenants_staff_see_the_entries_about_their_keys_and_memory_only():
    tenant = StaffUserFactory(username="tenant", perms=["audit.view_auditentry"])
    other = UserFactory(username="other")
    mine = api_key_create(username="tenant", roles=[]).api_key
    theirs = api_key_create(username="other", roles=[]).api_key
    api_key_revoke(api_key=mine, actor="cli:ops")
    api_key_revoke(api_key=theirs, actor="cli:ops")
    memory_erase_owner(owner_id=other.pk, actor="cli:ops")
    client = _login(tenant)
    listing = client.get(reverse("admin:audit_auditentry_changelist"))
    shown = {(e.action, e.object_id) for e in listing.context["cl"].result_list}
    assert shown == {("apikey.create", str(mine.pk)), ("apikey.revoke", str(mine.pk))}


# --- Deletes on the newer pages (issue 43) -------------------------------------------------


def test_deletes_of_samples_deliveries_and_evaluations_are_entries_keeping_no_content(root):
    from evaluations.models import Evaluation
    from hooks.models import WebhookDelivery
    from tests.factories import EvaluationFactory, SessionFactory
    from tests.observability.test_admin import SECRET_PROMPT, _record

    sample = _record()
    delivery = WebhookDelivery.objects.create(
        session=SessionFactory(), turn=1, url="https://app.example/h",
        finished={"result": "DELIVERY-PLANTED"},
    )  # fmt: skip
    evaluation = EvaluationFactory()
    for model, row in (
        ("observability/promptsample", sample),
        ("hooks/webhookdelivery", delivery),
        ("evaluations/evaluation", evaluation),
    ):
        changelist = f"/admin/{model}/"
        response = root.post(
            changelist, {"action": "delete_selected", "_selected_action": [row.pk], "post": "yes"}
        )
        assert response.status_code == 302, (model, response.content.decode()[:2000])
    assert not Evaluation.objects.exists() and not WebhookDelivery.objects.exists()

    deleted = AuditEntry.objects.filter(action="admin.delete").order_by("id")
    assert [(e.object_type, e.actor) for e in deleted] == [
        ("observability.promptsample", "admin:root"),
        ("hooks.webhookdelivery", "admin:root"),
        ("evaluations.evaluation", "admin:root"),
    ]
    kept = str([e.before for e in deleted])
    assert SECRET_PROMPT not in kept and "DELIVERY-PLANTED" not in kept
    assert deleted[0].before["request"] == deleted[1].before["finished"] == WITHHELD


def test_an_approval_is_never_deleted_in_the_admin(root):
    from django.utils import timezone

    from approvals.models import Approval
    from tests.factories import SessionFactory

    approval = Approval.objects.create(
        session=SessionFactory(), tool_name="refund", deadline=timezone.now()
    )
    root.post(
        "/admin/approvals/approval/",
        {"action": "delete_selected", "_selected_action": [approval.pk], "post": "yes"},
    )
    assert root.post(f"/admin/approvals/approval/{approval.pk}/delete/").status_code == 403
    assert Approval.objects.filter(pk=approval.pk).exists()
