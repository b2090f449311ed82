"""Writing memory: remember (merge near-duplicates, supersede old values), touch, erase,
and a large owner's own search index."""

import time
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal
from uuid import UUID

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from .dispatch import owner_index_enqueue
from .embeddings import Embedder, EmbeddingError, current_embedder, embed_texts
from .extraction import subject_of
from .index import owner_index_create, owner_index_drop, owner_index_indexable, owner_index_name
from .models import EmbeddingEndpoint, MemoryItem, MemoryOwnerIndex, MemoryTag, OwnerIndexState
from .selectors import exact_scan_max, memory_nearest, memory_owner_live_count

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
    5. Else a new item; one that takes the owner past the exact-scan limit
       queues the build of the owner's own index (memory_owner_index_request).
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
    remembered = _remember_write(owner_id, subject, content, tag, now, fields, nearest, source_key)
    if remembered.action == "created":
        memory_owner_index_request(owner_id=owner_id, dims=len(vector))
    return remembered


def _remember_write(
    owner_id: int,
    subject: str,
    content: str,
    tag: str,
    now: Any,
    fields: dict[str, Any],
    nearest: list[Any],
    source_key: str,
) -> Remembered:
    """Steps 3-5 of memory_remember, in one short transaction."""
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
                    twin.embedding = fields["embedding"]
                    twin.subject = twin.subject or subject
                    twin.importance = max(twin.importance, fields["importance"])
                    twin.confidence = max(twin.confidence, fields["confidence"])
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
    """Erase everything remembered about one user, history included, and the user's indexes.

    1. Delete the items and the index records.
    2. After commit, drop the indexes (CONCURRENTLY cannot run in a transaction;
       an erase inside a caller's transaction drops them when that one commits).
    """
    names = list(MemoryOwnerIndex.objects.filter(owner_id=owner_id).values_list("name", flat=True))
    with transaction.atomic():
        deleted, _ = MemoryItem.objects.filter(owner_id=owner_id).delete()
        MemoryOwnerIndex.objects.filter(owner_id=owner_id).delete()
        for name in names:
            transaction.on_commit(partial(owner_index_drop, name=name))
    return deleted


def memory_owner_index_request(*, owner_id: int, dims: int) -> bool:
    """Queue the build of the owner's index once the owner is past the exact-scan limit.

    1. Count the owner's live items of `dims`, bounded (an index-only scan).
    2. Past the limit, insert the index record; the unique (owner, dims)
       constraint lets exactly one writer in, and only that one enqueues the
       build, after its commit. Returns True when this call queued it.
    """
    limit = exact_scan_max()
    if not owner_index_indexable(dims):
        return False
    if memory_owner_live_count(owner_id=owner_id, dims=dims, limit=limit + 1) <= limit:
        return False
    _, created = MemoryOwnerIndex.objects.get_or_create(
        owner_id=owner_id, dims=dims, defaults={"name": owner_index_name(owner_id, dims)}
    )
    if created:
        transaction.on_commit(lambda: _owner_index_enqueue(owner_id, dims))
    return created


def _owner_index_enqueue(owner_id: int, dims: int) -> None:
    # Not queued (broker down): forget the record, so the owner's next write asks again.
    if not owner_index_enqueue(owner_id=owner_id, dims=dims):
        MemoryOwnerIndex.objects.filter(
            owner_id=owner_id, dims=dims, state=OwnerIndexState.PENDING
        ).delete()


def memory_owner_index_build(
    *, owner_id: int, dims: int, maintenance_work_mem: str | None = None
) -> MemoryOwnerIndex:
    """Build the owner's own HNSW index of `dims` (the Celery task's service; the bench's too).

    1. Take the record (made by memory_owner_index_request, or here) and mark it building.
    2. CREATE INDEX CONCURRENTLY, outside any transaction: writes go on meanwhile.
    3. Mark it ready with the item count it was built at; searches use it from now.
       A failure drops the half-built index, marks the record failed and re-raises
       (the task retries).
    """
    record, _ = MemoryOwnerIndex.objects.get_or_create(
        owner_id=owner_id, dims=dims, defaults={"name": owner_index_name(owner_id, dims)}
    )
    MemoryOwnerIndex.objects.filter(pk=record.pk).update(state=OwnerIndexState.BUILDING, error="")
    started = time.perf_counter()
    try:
        owner_index_create(
            owner_id=owner_id,
            dims=dims,
            maintenance_work_mem=maintenance_work_mem or settings.MEMORY_INDEX_BUILD_MEM,
        )
    except Exception as exc:
        owner_index_drop(name=record.name)
        MemoryOwnerIndex.objects.filter(pk=record.pk).update(
            state=OwnerIndexState.FAILED, error=str(exc)[:2000]
        )
        raise
    items = memory_owner_live_count(owner_id=owner_id, dims=dims, limit=2**31 - 1)
    MemoryOwnerIndex.objects.filter(pk=record.pk).update(
        state=OwnerIndexState.READY,
        items_at_build=items,
        build_s=time.perf_counter() - started,
        built_at=timezone.now(),
    )
    record.refresh_from_db()
    return record


def embedding_endpoint_save(*, endpoint: EmbeddingEndpoint) -> None:
    """Save an endpoint (search needs no index per dimension: see memory/selectors.py)."""
    endpoint.save()


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
