"""Runs started by a clock and calls back when a run ends (DESIGN.md "Schedules and run
webhooks").

A schedule's fire is a row keyed by (schedule, due time): the run it starts commits with
it, so a due time fires once however many beats, workers or restarts look at it. A
webhook's delivery is an outbox row keyed by (session, turn), written by the turn's final
commit (engine/store/commit.py) and sent by a task: once per turn, whoever retries.
"""

from django.conf import settings
from django.db import models
from django.utils import timezone


class Overlap(models.TextChoices):
    SKIP = "skip", "skip (a due time while the last run is still going starts nothing)"
    QUEUE = "queue", "queue (it starts once the last run has ended)"
    ALLOW = "allow", "allow (runs side by side)"


class Schedule(models.Model):
    """Start a workflow run (or an agent turn, in a new session) at each time its cron
    expression names, in its time zone."""

    name = models.CharField(max_length=64, unique=True)
    cron = models.CharField(max_length=120, help_text="Five fields: minute hour day month weekday.")
    timezone = models.CharField(max_length=64, default="UTC")
    workflow = models.CharField(
        max_length=100,
        blank=True,
        help_text="The workflow's slug (or leave empty and name an agent).",
    )
    agent = models.CharField(max_length=100, blank=True, help_text="An agent's slug.")
    message = models.TextField(blank=True, help_text="The agent turn's user message.")
    input = models.JSONField(default=dict, blank=True, help_text="The workflow run's input.")
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.PROTECT,
        related_name="schedules",
        help_text="Whose runs they are (and who is billed for them).",
    )
    api_key = models.ForeignKey(
        "accounts.ApiKey",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="schedules",
        help_text="The key whose roles the runs use and whose spend they count as; empty: the "
        "workflow's role (an agent turn: the agent's default role).",
    )
    overlap = models.CharField(max_length=8, choices=Overlap.choices, default=Overlap.SKIP)
    webhook_url = models.CharField(
        max_length=500, blank=True, help_text="Called when each run ends (egress policy applies)."
    )
    enabled = models.BooleanField(default=True)
    # The next due time not yet fired: a tick that finds it passed fires it (once) and moves
    # it on from now, so times missed while everything was down come to one run.
    next_due_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        indexes = [
            models.Index(
                fields=["next_due_at"],
                name="schedule_due",
                condition=models.Q(enabled=True),
            )
        ]

    def __str__(self) -> str:
        return self.name


class FireStatus(models.TextChoices):
    STARTED = "started", "started"
    QUEUED = "queued", "queued behind the last run"
    SKIPPED = "skipped", "skipped (the last run was still going)"
    FAILED = "failed", "could not start"


class ScheduleFire(models.Model):
    """One due time of a schedule and what it did: the key that makes it fire once."""

    # No index of its own: schedule_fire_once leads with it.
    schedule = models.ForeignKey(
        Schedule, on_delete=models.CASCADE, related_name="fires", db_index=False
    )
    due = models.DateTimeField()
    status = models.CharField(max_length=8, choices=FireStatus.choices)
    session = models.ForeignKey(
        "agent_sessions.Session",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
    )
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["schedule", "due"], name="schedule_fire_once")
        ]

    def __str__(self) -> str:
        return f"{self.schedule} at {self.due:%Y-%m-%d %H:%M %Z}"


class RunWebhook(models.Model):
    """Where to POST when a turn of a session ends: every turn (no message), or only the turn
    of one message."""

    session = models.ForeignKey(
        "agent_sessions.Session", on_delete=models.CASCADE, related_name="+"
    )
    message = models.ForeignKey(
        "agent_sessions.Message",
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="+",
    )
    url = models.CharField(max_length=500)
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"{self.session_id}: {self.url}"


class DeliveryStatus(models.TextChoices):
    PENDING = "pending", "pending"
    SENT = "sent", "sent"
    FAILING = "failing", "failing (retried with backoff)"
    FAILED = "failed", "failed (gave up)"


class WebhookDelivery(models.Model):
    """The outbox: one per turn that had a webhook, written in that turn's final commit."""

    session = models.ForeignKey(
        "agent_sessions.Session", on_delete=models.CASCADE, related_name="+", db_index=False
    )
    turn = models.IntegerField()
    url = models.CharField(max_length=500)
    # The turn's turn.finished payload (outcome, usage, a run's result), as committed.
    finished = models.JSONField(default=dict)
    status = models.CharField(
        max_length=8, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING
    )
    attempts = models.IntegerField(default=0)
    next_attempt_at = models.DateTimeField(default=timezone.now)
    # A sender holds the row until then: a killed worker's claim runs out, and the sweep
    # sends it again (with the same Idempotency-Key).
    claimed_until = models.DateTimeField(null=True, blank=True)
    last_error = models.CharField(max_length=300, blank=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        verbose_name_plural = "webhook deliveries"
        constraints = [
            models.UniqueConstraint(fields=["session", "turn"], name="webhook_delivery_once")
        ]
        indexes = [
            models.Index(
                fields=["next_attempt_at"],
                name="webhook_delivery_due",
                condition=models.Q(status__in=["pending", "failing"]),
            )
        ]

    def __str__(self) -> str:
        return f"{self.session_id}:{self.turn}"
