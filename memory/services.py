"""Writing memory: remember (add, update, delete or keep against what the owner has, every
change kept as a version), touch, erase, and a large owner's own search index."""

import time
from dataclasses import dataclass
from functools import partial
from typing import Literal
from uuid import UUID

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from audit.models import AuditAction
from audit.services import SYSTEM, audit_record

from .decision import Decision, rule_decide
from .dispatch import owner_index_enqueue
from .embeddings import Embedder, EmbeddingError, current_embedder, embed_texts
from .extraction import subject_of
from .index import owner_index_create, owner_index_drop, owner_index_indexable, owner_index_name
from .models import (
    EmbeddingEndpoint,
    MemoryItem,
    MemoryOwnerIndex,
    MemoryTag,
    MemoryVersion,
    OwnerIndexState,
    VersionAction,
    VersionActor,
)
from .selectors import exact_scan_max, memory_neighbours, memory_owner_live_count

MAX_CONTENT_CHARS = 2000
NEIGHBOURS = 5  # the nearest live items a new memory is compared with

Action = Literal["created", "updated", "deleted", "unchanged"]


@dataclass(frozen=True)
class Remembered:
    item: MemoryItem
    action: Action
    previous: str = ""  # the item's text before an update or a delete
    reason: str = ""


@dataclass(frozen=True)
class _Write:
    """One memory write's facts, as memory_remember received them."""

    owner_id: int
    content: str
    subject: str
    tag: str
    importance: float
    confidence: float
    source: str
    source_session_id: UUID | str | None
    source_key: str
    actor_ref: str
    decided_by: str
    vector: list[float]
    embedding_model: str


def memory_remember(
    *,
    owner_id: int,
    content: str,
    tag: str = MemoryTag.FACT,
    subject: str = "",
    importance: float = 0.5,
    confidence: float = 0.8,
    source: str = VersionActor.TOOL,
    source_session_id: UUID | str | None = None,
    source_key: str = "",
    actor_ref: str = "",
    decision: Decision | None = None,
    decided_by: str = "rules",
    embedder: Embedder | None = None,
) -> Remembered:
    """Apply one new memory to what the owner already has, keeping every version.

    1. A write already made under `source_key` (a re-run step or task) is returned as is.
    2. Embed the content (cached by hash; outside any transaction).
    3. Under the owner's lock: without a `decision` (the model's, made before), compare
       with the owner's live item of the same subject and its nearest live items and
       decide by the rules (memory/decision.py); with one, check it still applies.
    4. Apply it: add a new item, update one (its previous text stays as a version),
       delete one (no longer live, kept as history) or keep one as it is. Every change
       writes a MemoryVersion: what it says now, who, when, why.
    5. A new item that takes the owner past the exact-scan limit queues the build of
       the owner's own index (memory_owner_index_request).
    """
    if decision is not None:
        # The model's wording and subject are what is stored (and embedded, and locked on).
        content = decision.content or content
        subject = decision.subject or subject
    content = content.strip()[:MAX_CONTENT_CHARS]
    if source_key:
        done = _done(owner_id, source_key)
        if done is not None:
            return Remembered(done, "unchanged", reason="already written")
    subject = " ".join((subject or subject_of(content)).lower().split())[:200]
    embedder = embedder or current_embedder()
    vector = embed_texts([content], embedder)[0] if content else []
    write = _Write(
        owner_id=owner_id,
        content=content,
        subject=subject,
        tag=(tag or MemoryTag.FACT)[:40],
        importance=min(1.0, max(0.0, importance)),
        confidence=min(1.0, max(0.0, confidence)),
        source=source if source in VersionActor.values else VersionActor.TOOL,
        source_session_id=source_session_id,
        source_key=source_key,
        actor_ref=actor_ref or source_key,
        decided_by=decided_by,
        vector=vector,
        embedding_model=embedder.model,
    )
    try:
        remembered = _remember_locked(write, decision)
    except IntegrityError:
        done = _done(owner_id, source_key) if source_key else None
        if done is not None:  # a concurrent run of the same step wrote it first
            return Remembered(done, "unchanged", reason="already written")
        # A live item of the subject appeared past the lock (an operator's edit):
        # decide again against it.
        remembered = _remember_locked(write, None)
    if remembered.action == "created":
        memory_owner_index_request(owner_id=owner_id, dims=len(vector))
    return remembered


def _done(owner_id: int, source_key: str) -> MemoryItem | None:
    made = MemoryItem.objects.filter(owner_id=owner_id, source_key=source_key).first()
    if made is not None:
        return made
    version = (
        MemoryVersion.objects.filter(owner_id=owner_id, source_key=source_key)
        .select_related("item")
        .first()
    )
    return version.item if version is not None else None


def _owner_lock(owner_id: int) -> None:
    """Serialise one owner's memory writes until the transaction ends.

    Per owner rather than per subject: a decision also compares items without a
    subject ("I prefer tea" / "I prefer coffee"), which no subject lock would cover;
    an owner writes a few items a turn, so the wait is nothing. The unique live
    subject constraint backs it up.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [f"memory:{owner_id}"]
        )


def _remember_locked(write: _Write, decision: Decision | None) -> Remembered:
    """Steps 3-4 of memory_remember, in one short transaction (no model call inside)."""
    with transaction.atomic():
        _owner_lock(write.owner_id)
        neighbours, current = memory_neighbours(
            owner_id=write.owner_id,
            vector=write.vector,
            model=write.embedding_model,
            k=NEIGHBOURS,
            subject=write.subject,
        )
        if decision is None:
            decision = rule_decide(
                content=write.content,
                subject=write.subject,
                neighbours=neighbours,
                current=current,
            )
        elif decision.action == "add" and current is not None:
            # Decided before a value of this subject was written: it updates that one.
            decision = rule_decide(
                content=write.content, subject=write.subject, neighbours=[], current=current
            )
        target = None
        if decision.target is not None:
            target = (
                MemoryItem.objects.select_for_update()
                .filter(owner_id=write.owner_id, pk=decision.target, superseded_at__isnull=True)
                .first()
            )
            if target is None:  # gone since the decision: decide again on what is live
                decision = rule_decide(
                    content=write.content,
                    subject=write.subject,
                    neighbours=[n for n in neighbours if n.id != decision.target],
                    current=current if current and current.id != decision.target else None,
                )
                target = (
                    MemoryItem.objects.select_for_update().get(pk=decision.target)
                    if decision.target is not None
                    else None
                )
        return _apply(write, decision, target)


def _apply(write: _Write, decision: Decision, target: MemoryItem | None) -> Remembered:
    now = timezone.now()
    if decision.action == "keep" and target is not None:
        # Said again: it counts as fresh for the time decay.
        MemoryItem.objects.filter(pk=target.pk).update(updated_at=now)
        return Remembered(target, "unchanged", reason=decision.reason)
    if decision.action == "update" and target is not None:
        previous = target.content
        target.content = write.content
        target.embedding, target.dims = write.vector, len(write.vector)
        target.embedding_model = write.embedding_model
        target.subject = target.subject or decision.subject or write.subject
        tag = decision.tag or write.tag
        if tag and tag != MemoryTag.FACT:  # a new value keeps what kind of thing it is
            target.tag = tag
        importance = decision.importance if decision.importance is not None else write.importance
        target.importance = max(target.importance, importance)
        target.confidence = write.confidence
        target.source_session_id = write.source_session_id or target.source_session_id
        target.save()
        _version(write, target, VersionAction.UPDATED, decision.reason)
        return Remembered(target, "updated", previous=previous, reason=decision.reason)
    item = MemoryItem.objects.create(
        owner_id=write.owner_id,
        tag=decision.tag or write.tag,
        subject=decision.subject or write.subject,
        content=write.content,
        embedding=write.vector or None,
        dims=len(write.vector),
        embedding_model=write.embedding_model if write.vector else "",
        importance=decision.importance if decision.importance is not None else write.importance,
        confidence=write.confidence,
        source=write.source,
        source_session_id=write.source_session_id,
        source_key=write.source_key,
    )
    _version(write, item, VersionAction.CREATED, decision.reason)
    return Remembered(item, "created", reason=decision.reason)


def memory_forget(
    *,
    owner_id: int,
    item_id: int,
    reason: str,
    source: str = VersionActor.EXTRACTION,
    source_session_id: UUID | str | None = None,
    source_key: str = "",
    actor_ref: str = "",
    decided_by: str = "rules",
) -> Remembered | None:
    """Take one of the owner's live items out of what the model sees, keeping it as history.

    None when there is nothing to do: the item is another owner's, already gone, or
    this write (`source_key`) was made before.
    """
    if source_key and _done(owner_id, source_key) is not None:
        return None
    write = _Write(
        owner_id=owner_id, content="", subject="", tag="", importance=0.0, confidence=0.0,
        source=source if source in VersionActor.values else VersionActor.EXTRACTION,
        source_session_id=source_session_id, source_key=source_key,
        actor_ref=actor_ref or source_key, decided_by=decided_by, vector=[], embedding_model="",
    )  # fmt: skip
    with transaction.atomic():
        _owner_lock(owner_id)
        target = (
            MemoryItem.objects.select_for_update()
            .filter(owner_id=owner_id, pk=item_id, superseded_at__isnull=True)
            .first()
        )
        if target is None:
            return None
        target.superseded_at = timezone.now()
        target.save(update_fields=["superseded_at", "updated_at"])
        _version(write, target, VersionAction.DELETED, reason)
    return Remembered(target, "deleted", previous=target.content, reason=reason)


def _version(write: _Write, item: MemoryItem, action: str, reason: str) -> None:
    MemoryVersion.objects.create(
        item=item,
        owner_id=item.owner_id,
        action=action,
        content=item.content,
        subject=item.subject,
        tag=item.tag,
        actor=write.source,
        actor_ref=write.actor_ref[:200],
        decided_by=write.decided_by[:120],
        reason=reason[:300],
        source_session_id=write.source_session_id,
        source_key=write.source_key,
    )


def memory_touch(*, item_ids: list[int]) -> None:
    """Mark items as used in a context (for the admin; ranking decays on updated_at)."""
    if item_ids:
        MemoryItem.objects.filter(pk__in=item_ids).update(last_used_at=timezone.now())


def memory_erase_owner(*, owner_id: int, actor: str = SYSTEM) -> int:
    """Erase everything remembered about one user, history (versions) included, and the
    user's indexes; the number of items erased.

    1. Delete the items and the index records.
    2. Enter the erasure in the audit trail, by `actor`, with how much went: the counts,
       never what was remembered (the trail would keep what the erasure took away).
    3. After commit, drop the indexes (CONCURRENTLY cannot run in a transaction;
       an erase inside a caller's transaction drops them when that one commits).
    """
    names = list(MemoryOwnerIndex.objects.filter(owner_id=owner_id).values_list("name", flat=True))
    with transaction.atomic():
        _, per_model = MemoryItem.objects.filter(owner_id=owner_id).delete()
        deleted = per_model.get(MemoryItem._meta.label, 0)  # the items (their versions go too)
        MemoryOwnerIndex.objects.filter(owner_id=owner_id).delete()
        users = get_user_model()
        username = (
            users.objects.filter(pk=owner_id).values_list(users.USERNAME_FIELD, flat=True).first()
        )
        audit_record(
            action=AuditAction.MEMORY_ERASE,
            actor=actor,
            object_type=users._meta.label_lower,
            object_id=owner_id,
            object_repr=str(username or owner_id),
            owner_id=owner_id if username is not None else None,
            before={
                "items": deleted,
                "versions": per_model.get(MemoryVersion._meta.label, 0),
                "indexes": len(names),
            },
            after={"items": 0, "versions": 0, "indexes": 0},
        )
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


def memory_item_save(*, item: MemoryItem, reembed: bool, actor_ref: str = "") -> None:
    """Save an operator's edit (or new item), recorded as a version by `actor_ref`.

    A changed text gets its new vector (an unreachable endpoint leaves the item without
    one: it is listed, not searched, until edited again).
    """
    if reembed:
        embedder = current_embedder()
        try:
            item.embedding = embed_texts([item.content], embedder)[0]
            item.dims, item.embedding_model = embedder.dimension, embedder.model
        except EmbeddingError:
            item.embedding, item.dims, item.embedding_model = None, 0, ""
    item.subject = " ".join(item.subject.lower().split())
    created = item.pk is None
    write = _Write(
        owner_id=item.owner_id, content=item.content, subject=item.subject, tag=item.tag,
        importance=item.importance, confidence=item.confidence, source=VersionActor.ADMIN,
        source_session_id=None, source_key="", actor_ref=actor_ref, decided_by="admin",
        vector=[], embedding_model="",
    )  # fmt: skip
    with transaction.atomic():
        _owner_lock(item.owner_id)
        item.save()
        action = VersionAction.CREATED if created else VersionAction.EDITED
        _version(write, item, action, "added in the admin" if created else "edited in the admin")
