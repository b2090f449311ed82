"""Operators list, search, edit and erase memory per owner."""

import pytest
from django.contrib.auth import get_user_model
from django.urls import reverse

from memory.models import MemoryItem, MemoryOwnerIndex
from memory.services import memory_remember
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def operator(client):
    user = get_user_model().objects.create_superuser("operator", "op@example.com", "pw")
    client.force_login(user)
    return user


def test_list_search_and_edit(client, operator, embeddings):
    alice = UserFactory(username="alice")
    memory_remember(owner_id=alice.pk, content="My favourite colour is blue")
    memory_remember(owner_id=alice.pk, content="My favourite colour is red")
    url = reverse("admin:memory_memoryitem_changelist")
    page = client.get(url, {"q": "alice"}).content.decode()
    assert "My favourite colour is red" in page and "latest" in page
    assert "My favourite colour is red" not in client.get(url, {"q": "nobody"}).content.decode()
    item = MemoryItem.objects.get(content="My favourite colour is red")
    before = list(item.embedding)
    change = reverse("admin:memory_memoryitem_change", args=[item.pk])
    response = client.post(
        change,
        {"owner": alice.pk, "tag": "preference", "subject": "favourite colour",
         "content": "My favourite colour is green", "importance": 0.9, "confidence": 1.0},
    )  # fmt: skip
    assert response.status_code == 302, response.content.decode()[:2000]
    item.refresh_from_db()
    assert item.content == "My favourite colour is green" and list(item.embedding) != before
    # The change page shows the item's history: every value, who brought it, what decided.
    page = client.get(change).content.decode()
    history = page[page.index("<th>when</th>") :]
    assert (
        history.index("colour is blue")
        < history.index("colour is red")
        < history.index("colour is green")
    )
    assert "admin:operator" in history and "same subject: favourite colour" in history


def test_an_edit_cannot_make_two_live_items_of_one_subject(client, operator, embeddings):
    alice = UserFactory(username="alice")
    memory_remember(owner_id=alice.pk, content="My favourite colour is blue")
    tea = memory_remember(owner_id=alice.pk, content="I like tea").item
    change = reverse("admin:memory_memoryitem_change", args=[tea.pk])
    response = client.post(
        change,
        {"owner": alice.pk, "tag": "preference", "subject": "Favourite Colour",
         "content": "I like tea", "importance": 0.5, "confidence": 0.8},
    )  # fmt: skip
    assert response.status_code == 200 and "already has a live item" in response.content.decode()
    assert MemoryItem.objects.get(pk=tea.pk).subject == ""


def test_erase_everything_of_a_user_asks_first(client, operator, embeddings):
    alice, bob = UserFactory(username="alice"), UserFactory(username="bob")
    memory_remember(owner_id=alice.pk, content="My favourite colour is blue")
    memory_remember(owner_id=alice.pk, content="My favourite colour is red")
    memory_remember(owner_id=alice.pk, content="I like tea")
    memory_remember(owner_id=bob.pk, content="I like espresso")
    one = MemoryItem.objects.filter(owner=alice).first()
    url = reverse("admin:memory_memoryitem_changelist")
    data = {"action": "erase_owners", "_selected_action": [one.pk]}

    confirm = client.post(url, data)
    assert confirm.status_code == 200
    assert "alice: 2 items" in confirm.content.decode()
    assert MemoryItem.objects.filter(owner=alice).count() == 2  # nothing erased yet

    done = client.post(url, {**data, "confirm": "yes"})
    assert done.status_code == 302
    assert not MemoryItem.objects.filter(owner=alice).exists()
    assert MemoryItem.objects.filter(owner=bob).count() == 1


def test_owner_indexes_are_listed_read_only(client, operator):
    alice = UserFactory(username="alice")
    MemoryOwnerIndex.objects.create(
        owner=alice, dims=256, name="memory_owner_1_hnsw_256", state="failed", error="boom"
    )
    url = reverse("admin:memory_memoryownerindex_changelist")
    page = client.get(url).content.decode()
    assert "memory_owner_1_hnsw_256" in page and "failed" in page and "alice" in page
    assert client.get(reverse("admin:memory_memoryownerindex_add")).status_code == 403
