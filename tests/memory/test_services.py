"""Writing and ranking memory against a fake embeddings server with controlled semantics."""

from datetime import UTC, datetime

import pytest
from django.utils import timezone

from memory.embeddings import HashingEmbedder, current_embedder, embed_texts
from memory.models import EmbeddingCache, MemoryItem, MemoryOwnerIndex, MemoryVersion
from memory.selectors import memory_block, memory_ranked
from memory.services import memory_erase_owner, memory_owner_index_request, memory_remember
from tests.factories import UserFactory
from tests.memory.conftest import DIMENSION

pytestmark = pytest.mark.django_db
BLUE_AT = datetime(2026, 11, 20, 9, 0, tzinfo=UTC)


def _block(owner_id: int, query: str, **kwargs: object) -> str:
    embedder = current_embedder()
    vector = embed_texts([query], embedder)[0]
    return memory_block(
        memory_ranked(owner_id=owner_id, vector=vector, model=embedder.model, **kwargs)  # type: ignore[arg-type]
    )


def test_paraphrases_merge_into_one_item(embeddings):
    owner = UserFactory()
    first = memory_remember(owner_id=owner.pk, content="I like espresso", tag="preference")
    again = memory_remember(owner_id=owner.pk, content="I prefer coffee", tag="preference")
    assert (first.action, again.action) == ("created", "updated")
    assert again.item.pk == first.item.pk and again.previous == "I like espresso"
    items = list(MemoryItem.objects.filter(owner=owner))
    assert len(items) == 1 and items[0].content == "I prefer coffee"  # the newer wording
    # The older wording is not lost: it is the item's first version.
    assert [(v.action, v.content) for v in items[0].versions.all()] == [
        ("created", "I like espresso"),
        ("updated", "I prefer coffee"),
    ]
    # Something else is a new item.
    other = memory_remember(owner_id=owner.pk, content="My dog is called Rex")
    assert other.action == "created" and MemoryItem.objects.filter(owner=owner).count() == 2


def test_a_changed_preference_resolves_to_the_newest_and_keeps_history(embeddings):
    owner = UserFactory()
    first = memory_remember(
        owner_id=owner.pk, content="My favourite colour is blue", tag="preference"
    )
    MemoryVersion.objects.filter(item=first.item).update(created_at=BLUE_AT)
    changed = memory_remember(owner_id=owner.pk, content="my favorite color is red")
    assert changed.action == "updated" and changed.previous == "My favourite colour is blue"
    assert changed.item.pk == first.item.pk and changed.item.subject == "favourite colour"
    assert changed.item.tag == "preference"  # a new value keeps what kind of thing it is
    assert MemoryItem.objects.filter(owner=owner).count() == 1

    block = _block(owner.pk, "which colour do I like?")
    assert (
        "latest: my favorite color is red (before: My favourite colour is blue, 2026-11-20)"
        in block
    )
    assert block.count("colour is blue") == 1  # the old value only as history

    # A third value: the newest wins, the previous ones are listed newest first.
    memory_remember(owner_id=owner.pk, content="My favourite colour is green")
    block = _block(owner.pk, "favourite colour")
    today = timezone.now().strftime("%Y-%m-%d")
    assert (
        f"latest: My favourite colour is green (before: my favorite color is red, {today}; "
        "My favourite colour is blue, 2026-11-20)"
    ) in block
    history = MemoryVersion.objects.filter(item=first.item).order_by("id")
    assert [(v.action, v.actor, v.decided_by) for v in history] == [
        ("created", "tool", "rules"),
        ("updated", "tool", "rules"),
        ("updated", "tool", "rules"),
    ]
    assert [v.content for v in history] == [
        "My favourite colour is blue",
        "my favorite color is red",
        "My favourite colour is green",
    ]
    assert "same subject: favourite colour" in history[1].reason


def test_a_changed_preference_with_the_offline_embedder_leaves_one_live_value(db):
    """No embeddings endpoint: the hashing embedder finds "tea" and "coffee" unrelated, yet
    the new preference replaces the old one, which stays as history."""
    assert isinstance(current_embedder(), HashingEmbedder)
    owner = UserFactory()
    memory_remember(owner_id=owner.pk, content="I prefer tea", tag="preference")
    changed = memory_remember(owner_id=owner.pk, content="I now prefer coffee", tag="preference")
    assert changed.action == "updated" and changed.previous == "I prefer tea"
    live = MemoryItem.objects.filter(owner=owner, superseded_at__isnull=True)
    assert [i.content for i in live] == ["I now prefer coffee"]
    block = _block(owner.pk, "what do I prefer to drink, coffee?")
    assert "latest: I now prefer coffee (before: I prefer tea, " in block
    # The same with a subject the model gives: another wording, the same subject.
    memory_remember(owner_id=owner.pk, content="Lives in Paris", subject="Home  City")
    moved = memory_remember(owner_id=owner.pk, content="I moved to Berlin")
    assert moved.action == "updated" and moved.previous == "Lives in Paris"
    assert MemoryItem.objects.filter(owner=owner, superseded_at__isnull=True).count() == 2


def test_another_owners_memory_never_appears(embeddings):
    alice, bob = UserFactory(), UserFactory()
    memory_remember(owner_id=alice.pk, content="My address is Berlin")
    memory_remember(owner_id=bob.pk, content="I like tea")
    assert "Berlin" in _block(alice.pk, "where do I live, my address?")
    block = _block(bob.pk, "where do I live, my address?", min_similarity=-1.0)
    assert "Berlin" not in block and "tea" in block  # bob gets his own items only
    assert _block(UserFactory().pk, "address", min_similarity=-1.0) == ""


def test_a_rerun_write_with_the_same_key_writes_nothing_twice(embeddings):
    owner = UserFactory()
    a = memory_remember(owner_id=owner.pk, content="Invoices monthly", source_key="call:k1")
    b = memory_remember(owner_id=owner.pk, content="Invoices monthly", source_key="call:k1")
    assert (a.action, b.action, a.item.pk) == ("created", "unchanged", b.item.pk)
    assert MemoryItem.objects.filter(owner=owner).count() == 1


def test_vectors_are_cached_by_content_hash(embeddings):
    owner = UserFactory()
    memory_remember(owner_id=owner.pk, content="My dog is called Rex")
    memory_remember(owner_id=UserFactory().pk, content="My dog is called Rex")
    assert embeddings.texts_embedded.count("My dog is called Rex") == 1
    assert EmbeddingCache.objects.filter(model="fake-embed").count() == 1


def test_ranking_weighs_importance_and_filters_tags(embeddings):
    owner = UserFactory()
    memory_remember(owner_id=owner.pk, content="I like espresso", tag="preference", importance=0.1)
    memory_remember(
        owner_id=owner.pk, content="We agreed invoices monthly", tag="agreement", importance=1.0
    )
    embedder = current_embedder()
    vector = embed_texts(["espresso invoices"], embedder)[0]
    ranked = memory_ranked(owner_id=owner.pk, vector=vector, model=embedder.model, k=2)
    assert [r.item.tag for r in ranked] == ["agreement", "preference"]
    only = memory_ranked(
        owner_id=owner.pk, vector=vector, model=embedder.model, tags=["preference"]
    )
    assert [r.item.tag for r in only] == ["preference"]


def test_erase_everything_of_one_owner(embeddings):
    alice, bob = UserFactory(), UserFactory()
    memory_remember(owner_id=alice.pk, content="My favourite colour is blue")
    memory_remember(owner_id=alice.pk, content="My favourite colour is red")
    memory_remember(owner_id=bob.pk, content="I like tea")
    assert memory_erase_owner(owner_id=alice.pk) == 1  # one item, its history with it
    assert list(MemoryItem.objects.values_list("owner_id", flat=True)) == [bob.pk]
    assert list(MemoryVersion.objects.values_list("owner_id", flat=True)) == [bob.pk]


def test_crossing_the_exact_scan_limit_queues_one_index_build(
    embeddings, settings, django_capture_on_commit_callbacks
):
    settings.MEMORY_EXACT_SCAN_MAX = 2
    owner, other = UserFactory(), UserFactory()
    with django_capture_on_commit_callbacks() as queued:
        memory_remember(owner_id=owner.pk, content="My dog is called Rex")
        memory_remember(owner_id=owner.pk, content="I live in Berlin")
        memory_remember(owner_id=other.pk, content="I like tea")
    assert queued == [] and not MemoryOwnerIndex.objects.exists()  # at the limit: exact
    with django_capture_on_commit_callbacks() as queued:
        memory_remember(owner_id=owner.pk, content="I prefer tea")
        memory_remember(owner_id=owner.pk, content="Send invoices monthly")
        assert memory_owner_index_request(owner_id=owner.pk, dims=DIMENSION) is False
    assert len(queued) == 1  # one build per owner and dimension, however many writes
    record = MemoryOwnerIndex.objects.get()
    assert (record.owner_id, record.dims, record.state) == (owner.pk, DIMENSION, "pending")


def test_the_models_context_names_the_memory_once(embeddings):
    """The block had a heading of its own under the context's heading: printed twice."""
    from engine.model.context import MEMORY_HEADING, build_request
    from record.models import Agent

    owner = UserFactory()
    memory_remember(owner_id=owner.pk, content="I prefer tea to coffee", tag="preference")
    block = _block(owner.pk, "what do I like to drink?", min_similarity=-1.0)
    assert "tea" in block
    agent = Agent(slug="a", context_window=2000, tools=[], rules=[], system_prompt="Help.")
    request = build_request(agent=agent, history=[], tools={}, final=False, memory_block=block)
    everything = "\n".join(m.content for m in request.messages)
    assert everything.count("What you remember about this user") == 1, everything
    assert MEMORY_HEADING in everything and "I prefer tea to coffee" in everything
