"""Long-term memory items, the embeddings endpoint and the embedding cache.

Vectors are stored in an untyped `vector` column with their dimension beside
them (`dims`): an embeddings endpoint decides the dimension, and switching
endpoints must not need a schema change. HNSW needs a fixed dimension, so each
dimension in use gets a partial expression index,
`((embedding::vector(N)) vector_cosine_ops) WHERE dims = N` (pgvector's
documented way for mixed dimensions; memory/index.py creates them), and searches
cast the same way so the planner can use it.
"""

from django.conf import settings
from django.db import models
from django.db.models import Q
from pgvector.django import VectorField


class MemoryTag(models.TextChoices):
    PREFERENCE = "preference", "preference"
    CONCLUSION = "business conclusion", "business conclusion"
    AGREEMENT = "agreement", "agreement"
    FACT = "fact", "fact"
    NOTE = "note", "note"


class EmbeddingEndpoint(models.Model):
    """An OpenAI-compatible `/v1/embeddings` endpoint, declared like a model endpoint.

    The enabled endpoint with the lowest id is used; with none, the offline
    feature-hashing embedder (memory/embeddings.py).
    """

    name = models.SlugField(max_length=100, unique=True)
    base_url = models.URLField(max_length=500, help_text="Up to /v1, e.g. http://host:8000/v1")
    model = models.CharField(max_length=200)
    dimension = models.PositiveIntegerField()
    api_key_env = models.CharField(
        max_length=100, blank=True, help_text="Name of the environment variable holding the key."
    )
    timeout_s = models.FloatField(default=10.0)
    enabled = models.BooleanField(default=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.name} ({self.model}, {self.dimension}d)"


class MemoryItem(models.Model):
    # No index of its own: memory_item_owner_subject leads with it.
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        related_name="memory_items",
        db_index=False,
    )
    tag = models.CharField(max_length=40, default=MemoryTag.FACT)
    # What the item is about ("favourite colour"): a new value for the same subject
    # supersedes the old item instead of sitting beside it.
    subject = models.CharField(max_length=200, blank=True)
    content = models.TextField()
    embedding = VectorField(null=True, blank=True)
    dims = models.PositiveIntegerField(default=0)
    embedding_model = models.CharField(max_length=200, blank=True)
    importance = models.FloatField(default=0.5)
    confidence = models.FloatField(default=0.8)
    source = models.CharField(max_length=20, default="tool")  # tool | user | extraction | admin
    source_session_id = models.UUIDField(null=True, blank=True)
    # The tool call (or message) that wrote it: a step re-run after a crash writes nothing twice.
    source_key = models.CharField(max_length=200, blank=True)
    superseded_by = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="superseded"
    )
    superseded_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        # What a person told the agent is theirs: seeing it, and erasing it, each take their
        # own permission; "view" shows only that an item exists.
        permissions = [
            ("view_memory_content", "Can view what memory items say"),
            ("erase_memory", "Can erase everything remembered about an owner (irreversible)"),
        ]
        indexes = [
            models.Index(
                fields=["owner", "dims"],
                name="memory_item_owner_live",
                condition=Q(superseded_at__isnull=True),
            ),
            models.Index(fields=["owner", "subject"], name="memory_item_owner_subject"),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["owner", "source_key"],
                name="memory_item_owner_source_key",
                condition=~Q(source_key=""),
            ),
            # One live value per subject: two writers of the same subject racing past the
            # service's lock still cannot both stay live.
            models.UniqueConstraint(
                fields=["owner", "subject"],
                name="memory_item_one_live_subject",
                condition=Q(superseded_at__isnull=True) & ~Q(subject=""),
            ),
        ]

    def __str__(self) -> str:
        # The name shows in breadcrumbs, history and links (and logs): never what it says.
        return f"{self.tag} #{self.pk}"


class VersionAction(models.TextChoices):
    CREATED = "created", "created"
    UPDATED = "updated", "updated"  # a new value, or a near-duplicate's newer wording
    DELETED = "deleted", "deleted"  # no longer live; the row stays as history
    EDITED = "edited", "edited"  # an operator's edit in the admin


class VersionActor(models.TextChoices):
    """Who brought the change: the `remember` tool call, the user's own words ("remember
    that ..."), the end-of-turn extraction, or an operator."""

    TOOL = "tool", "tool call"
    USER = "user", "user"
    EXTRACTION = "extraction", "extraction"
    ADMIN = "admin", "admin"


class MemoryVersion(models.Model):
    """One state of a memory item: every change writes one, so no value is lost.

    The item holds its latest state; its versions, oldest first, are what it said before
    (`content` is the item's text after the change this row records).
    """

    item = models.ForeignKey(MemoryItem, on_delete=models.CASCADE, related_name="versions")
    # The item's owner, copied: a re-run write is found by (owner, source_key).
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        related_name="memory_versions",
        db_index=False,
    )
    action = models.CharField(max_length=10, choices=VersionAction.choices)
    content = models.TextField()
    subject = models.CharField(max_length=200, blank=True)
    tag = models.CharField(max_length=40, blank=True)
    actor = models.CharField(max_length=20, choices=VersionActor.choices)
    # Which tool call, message or operator ("call:<idempotency key>", "msg:12:0", "admin:ann").
    actor_ref = models.CharField(max_length=200, blank=True)
    # What decided the action: "rules", "model:<endpoint name>", or "admin".
    decided_by = models.CharField(max_length=120, blank=True)
    reason = models.CharField(max_length=300, blank=True)
    source_session_id = models.UUIDField(null=True, blank=True)
    source_key = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ("item", "id")
        constraints = [
            models.UniqueConstraint(
                fields=["owner", "source_key"],
                name="memory_version_owner_source_key",
                condition=~Q(source_key=""),
            )
        ]

    def __str__(self) -> str:
        return f"{self.action} of #{self.item_id}"


class EmbeddingCache(models.Model):
    """One vector per (content hash, embedding model): the same text is embedded once."""

    content_hash = models.CharField(max_length=64)
    model = models.CharField(max_length=200)
    dims = models.PositiveIntegerField()
    embedding = VectorField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["content_hash", "model"], name="embedding_cache_key")
        ]

    def __str__(self) -> str:
        return f"{self.model} {self.content_hash[:12]}"


class OwnerIndexState(models.TextChoices):
    PENDING = "pending", "pending"
    BUILDING = "building", "building"
    READY = "ready", "ready"
    FAILED = "failed", "failed"


class MemoryOwnerIndex(models.Model):
    """An owner past the exact-scan limit has its own partial HNSW index per dimension.

    The row exists from the moment a write pushes the owner past the limit (one
    row per owner and dimension: the unique constraint deduplicates the build
    task); search uses the index only once it is `ready`, and scans exactly before.
    """

    # No index of its own: memory_owner_index_key leads with it.
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        related_name="memory_indexes",
        db_index=False,
    )
    dims = models.PositiveIntegerField()
    name = models.CharField(max_length=63, unique=True)
    state = models.CharField(
        max_length=10, choices=OwnerIndexState.choices, default=OwnerIndexState.PENDING
    )
    items_at_build = models.PositiveIntegerField(default=0)
    build_s = models.FloatField(null=True, blank=True)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    built_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["owner", "dims"], name="memory_owner_index_key")
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.state})"
