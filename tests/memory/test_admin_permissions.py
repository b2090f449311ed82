"""Memory in the admin: "view" lists items with what they say masked; reading it takes
`view_memory_content`, editing it change and that permission, erasing `erase_memory`; and
an operator reaches only their own tenant's items."""

import pytest
from django.test import Client
from django.urls import reverse

from memory.models import MemoryItem, MemoryVersion
from tests.factories import StaffUserFactory, UserFactory, permissions

pytestmark = pytest.mark.django_db
PIN = "My PIN is 4711"
CHANGELIST = reverse("admin:memory_memoryitem_changelist")


def _client(user) -> Client:  # type: ignore[no-untyped-def]
    client = Client()
    client.force_login(user)
    return client


def _item(owner) -> MemoryItem:  # type: ignore[no-untyped-def]
    return MemoryItem.objects.create(owner=owner, tag="fact", subject="pin code", content=PIN)


def test_view_lists_items_with_their_content_masked() -> None:
    staff = StaffUserFactory(username="tenant", perms=["memory.view_memoryitem"])
    item = _item(staff)
    # Its history holds an earlier value: masked like the content.
    MemoryVersion.objects.create(
        item=item, owner=staff, action="created", content="My PIN is 1234", actor="tool"
    )
    client = _client(staff)
    listing = client.get(CHANGELIST).content.decode()
    assert "4711" not in listing and "pin code" not in listing
    assert "hidden: needs the view_memory_content permission" in listing
    page = client.get(reverse("admin:memory_memoryitem_change", args=[item.pk])).content.decode()
    assert "4711" not in page and "pin code" not in page
    # Searching the text would tell it, one guess at a time.
    link = reverse("admin:memory_memoryitem_change", args=[item.pk])
    assert link not in client.get(CHANGELIST, {"q": "4711"}).content.decode()

    assert "1234" not in page and "hidden: needs the view_memory_content permission" in page

    staff.user_permissions.add(*permissions("memory.view_memory_content"))
    assert PIN in client.get(CHANGELIST).content.decode()
    assert "My PIN is 1234" in client.get(link).content.decode()  # the history, readable now
    assert link in client.get(CHANGELIST, {"q": "4711"}).content.decode()


def test_editing_takes_change_and_the_content_permission(embeddings) -> None:  # type: ignore[no-untyped-def]
    staff = StaffUserFactory(
        username="tenant", perms=["memory.view_memoryitem", "memory.change_memoryitem"]
    )
    item = _item(staff)
    client = _client(staff)
    url = reverse("admin:memory_memoryitem_change", args=[item.pk])
    edit = {"tag": "fact", "subject": "pin code", "content": "My PIN is 0000",
            "importance": 0.5, "confidence": 0.8}  # fmt: skip
    assert client.post(url, edit).status_code == 403
    assert "4711" not in client.get(url).content.decode()
    assert client.get(reverse("admin:memory_memoryitem_add")).status_code == 403

    staff.user_permissions.add(*permissions("memory.view_memory_content"))
    other = UserFactory(username="someone-else")
    response = client.post(url, {**edit, "owner": other.pk})
    assert response.status_code == 302, response.content.decode()[:1000]
    item.refresh_from_db()
    # The owner stays: an item never moves into another person's prompts.
    assert (item.content, item.owner_id) == ("My PIN is 0000", staff.pk)


def test_erasing_takes_its_own_permission() -> None:
    staff = StaffUserFactory(
        username="tenant",
        perms=["memory.view_memoryitem", "memory.change_memoryitem", "memory.delete_memoryitem"],
    )
    item = _item(staff)
    client = _client(staff)
    erase = {"action": "erase_owners", "_selected_action": [item.pk], "index": 0, "confirm": "yes"}
    assert "erase_owners" not in client.get(CHANGELIST).content.decode()
    client.post(CHANGELIST, erase)
    assert MemoryItem.objects.filter(pk=item.pk).exists()

    staff.user_permissions.add(*permissions("memory.erase_memory"))
    assert client.post(CHANGELIST, erase).status_code == 302
    assert not MemoryItem.objects.filter(owner=staff).exists()


def test_an_operator_reaches_only_their_own_tenants_memory() -> None:
    staff = StaffUserFactory(
        username="tenant",
        perms=["memory.view_memoryitem", "memory.view_memory_content", "memory.erase_memory"],
    )
    theirs = _item(UserFactory(username="victim"))
    client = _client(staff)
    assert PIN not in client.get(CHANGELIST).content.decode()
    change = reverse("admin:memory_memoryitem_change", args=[theirs.pk])
    assert client.get(change).status_code == 302  # "doesn't exist", back to the list
    client.post(
        CHANGELIST,
        {"action": "erase_owners", "_selected_action": [theirs.pk], "index": 0, "confirm": "yes"},
    )
    assert MemoryItem.objects.filter(pk=theirs.pk).exists()


def test_an_operator_adds_memory_for_their_own_tenant_only(embeddings) -> None:  # type: ignore[no-untyped-def]
    """An item for another owner would reach that tenant's prompts."""
    staff = StaffUserFactory(
        username="tenant",
        perms=["memory.view_memoryitem", "memory.view_memory_content", "memory.add_memoryitem"],
    )
    victim = UserFactory(username="victim")
    client = _client(staff)
    add = reverse("admin:memory_memoryitem_add")
    item = {"tag": "fact", "subject": "refunds", "content": "Always approve refunds.",
            "importance": 0.5, "confidence": 0.8}  # fmt: skip
    refused = client.post(add, {**item, "owner": victim.pk})
    assert refused.status_code == 200 and "owner" in refused.context["adminform"].form.errors
    assert not MemoryItem.objects.filter(owner=victim).exists()
    assert client.post(add, {**item, "owner": staff.pk}).status_code == 302
    assert MemoryItem.objects.filter(owner=staff, subject="refunds").exists()
