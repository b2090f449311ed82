"""Writing memory: remember (merge near-duplicates, supersede old values), touch, erase."""

from dataclasses import dataclass
from typing import Any, Literal
from uuid import UUID

from django.db import IntegrityError, transaction
from django.utils import timezone

from .embeddings import Embedder, EmbeddingError, current_embedder, embed_texts
from .extraction import subject_of
from .index import memory_index_ensure
from .models import EmbeddingEndpoint, MemoryItem, MemoryTag
from .selectors import memory_nearest

# Cosine similarity above which a new item is the same memory said again.
DUPLICATE_THRESHOLD = 0.9
MAX_CONTENT_CHARS = 2000

Action = Literal["created", "merged", "superseded", "unchanged"]


@dataclass(frozen=True)
class Remembered:
    item: MemoryItem
    action: Action
    previous: str = ""  # the superseded content


def _same_text(a: str, b: str) -> bool:
    return " ".join(a.lower().split()) == " ".join(b.lower().split())


def memory_remember(
    *,
    owner_id: int,
    content: str,
    tag: str = MemoryTag.FACT,
    subject: str = "",
    importance: float = 0.5,
    confidence: float = 0.8,
    source: str = "tool",
    source_session_id: UUID | str | None = None,
    source_key: str = "",
    embedder: Embedder | None = None,
) -> Remembered:
    """Store what the owner wants kept, without piling up copies.

    1. A write already made under `source_key` (a re-run step) is returned as is.
    2. Embed the content (cached by hash; outside any transaction).
    3. The same subject with another value: the new item supersedes the old one,
       which stays as history (superseded_by, superseded_at).
    4. Else a near-duplicate (cosine >= DUPLICATE_THRESHOLD, no conflicting subject)
       is updated in place with the newer wording.
    5. Else a new item.
    """
    content = content.strip()[:MAX_CONTENT_CHARS]
    if source_key:
        done = MemoryItem.objects.filter(owner_id=owner_id, source_key=source_key).first()
        if done is not None:
            return Remembered(done, "unchanged")
    subject = (subject or subject_of(content)).strip().lower()[:200]
    embedder = embedder or current_embedder()
    vector = embed_texts([content], embedder)[0]
    now = timezone.now()
    importance = min(1.0, max(0.0, importance))
    confidence = min(1.0, max(0.0, confidence))
    fields: dict[str, Any] = {
        "owner_id": owner_id,
        "tag": (tag or MemoryTag.FACT)[:40],
        "subject": subject,
        "content": content,
        "embedding": vector,
        "dims": len(vector),
        "embedding_model": embedder.model,
        "importance": importance,
        "confidence": confidence,
        "source": source,
        "source_session_id": source_session_id,
        "source_key": source_key,
    }
    nearest = memory_nearest(owner_id=owner_id, vector=vector, model=embedder.model, k=1)
    try:
        with transaction.atomic():
            if subject:
                # Locked: two writers of the same subject do not both stay live.
                current = (
                    MemoryItem.objects.select_for_update()
                    .filter(owner_id=owner_id, subject=subject, superseded_at__isnull=True)
                    .order_by("-updated_at")
                    .first()
                )
                if current is not None:
                    if _same_text(current.content, content):
                        MemoryItem.objects.filter(pk=current.pk).update(updated_at=now)
                        return Remembered(current, "unchanged")
                    if tag == MemoryTag.FACT:
                        fields["tag"] = current.tag  # a new value keeps what kind of thing it is
                    item = MemoryItem.objects.create(**fields)
                    MemoryItem.objects.filter(
                        owner_id=owner_id, subject=subject, superseded_at__isnull=True
                    ).exclude(pk=item.pk).update(superseded_by=item, superseded_at=now)
                    return Remembered(item, "superseded", previous=current.content)
            if nearest and nearest[0].similarity >= DUPLICATE_THRESHOLD:
                twin = MemoryItem.objects.select_for_update().filter(pk=nearest[0].item_id).first()
                if (
                    twin is not None
                    and twin.superseded_at is None
                    and (not twin.subject or not subject or twin.subject == subject)
                ):
                    twin.content = content
                    twin.embedding = vector
                    twin.subject = twin.subject or subject
                    twin.importance = max(twin.importance, importance)
                    twin.confidence = max(twin.confidence, confidence)
                    twin.save(
                        update_fields=[
                            "content", "embedding", "subject", "importance", "confidence",
                            "updated_at",
                        ]
                    )  # fmt: skip
                    return Remembered(twin, "merged")
            return Remembered(MemoryItem.objects.create(**fields), "created")
    except IntegrityError:
        # A concurrent run of the same step wrote it first (unique owner + source_key).
        done = MemoryItem.objects.filter(owner_id=owner_id, source_key=source_key).first()
        if done is None:
            raise
        return Remembered(done, "unchanged")


def memory_touch(*, item_ids: list[int]) -> None:
    """Mark items as used in a context (for the admin; ranking decays on updated_at)."""
    if item_ids:
        MemoryItem.objects.filter(pk__in=item_ids).update(last_used_at=timezone.now())


def memory_erase_owner(*, owner_id: int) -> int:
    """Erase everything remembered about one user, history included."""
    deleted, _ = MemoryItem.objects.filter(owner_id=owner_id).delete()
    return deleted


def embedding_endpoint_save(*, endpoint: EmbeddingEndpoint) -> None:
    """Save an endpoint and make sure its dimension has its index."""
    endpoint.save()
    memory_index_ensure(dimension=endpoint.dimension)


def memory_item_save(*, item: MemoryItem, reembed: bool) -> None:
    """Save an operator's edit; a changed text gets its new vector (an unreachable endpoint
    leaves the item without one: it is listed, not searched, until edited again)."""
    if reembed:
        embedder = current_embedder()
        try:
            item.embedding = embed_texts([item.content], embedder)[0]
            item.dims, item.embedding_model = embedder.dimension, embedder.model
        except EmbeddingError:
            item.embedding, item.dims, item.embedding_model = None, 0, ""
    item.subject = item.subject.strip().lower()
    item.save()
