"""An evaluation (recorded turns replayed on a candidate), its moves and its scored turns."""

from django.conf import settings
from django.db import models

from record.models import Agent, Session

from .states import EvaluationState


class EvaluationStateChoice(models.TextChoices):
    QUEUED = EvaluationState.QUEUED.value
    RUNNING = EvaluationState.RUNNING.value
    FINISHED = EvaluationState.FINISHED.value
    FAILED = EvaluationState.FAILED.value
    CANCELLED = EvaluationState.CANCELLED.value


class Evaluation(models.Model):
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        related_name="evaluations",
        db_index=False,  # evaluation_owner_created leads with it
        help_text="Whose sessions it replays (an operator's evaluation: the operator).",
    )
    actor = models.CharField(max_length=150, help_text="api:NAME or admin:NAME.")
    # The agent whose rollout it speaks for (the sessions' agent when they share one).
    agent = models.ForeignKey(
        Agent,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="evaluations",
        db_index=False,  # evaluation_agent_created leads with it
    )
    # {"model": name} | {"system_prompt": str} | {"agent_version": "<slug>@<n>"}: what the
    # replays run on instead.
    candidate = models.JSONField()
    # The candidate agent (a disabled copy of the sessions' agent with the candidate applied).
    candidate_agent = models.ForeignKey(
        Agent, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    sessions = models.ManyToManyField(Session, related_name="evaluations", blank=True)
    allow_read_only_calls = models.BooleanField(default=False)
    judge = models.JSONField(null=True, blank=True)
    budget_cost = models.DecimalField(
        max_digits=14,
        decimal_places=6,
        null=True,
        blank=True,
        help_text="The replays' model cost it may spend; none: no limit.",
    )
    state = models.CharField(
        max_length=10, choices=EvaluationStateChoice.choices, default=EvaluationState.QUEUED
    )
    version = models.PositiveIntegerField(default=0)
    done = models.PositiveIntegerField(default=0)
    total = models.PositiveIntegerField(default=0)
    totals = models.JSONField(default=dict, blank=True)
    error = models.TextField(blank=True)
    spent = models.DecimalField(max_digits=14, decimal_places=6, default=0)
    # The worker running it and until when (evaluations/lease.py): "" when nobody holds
    # it; a lease that lapsed (a dead worker) is handed back by the sweeper.
    lease_owner = models.CharField(max_length=100, blank=True, default="")
    leased_until = models.DateTimeField(null=True, blank=True)
    # How many times the sweeper sent it again after its worker's lease lapsed.
    resumes = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["owner", "-created_at"], name="evaluation_owner_created"),
            models.Index(fields=["agent", "-created_at"], name="evaluation_agent_created"),
            # The sweeper's question: which unfinished ones nobody runs.
            models.Index(
                fields=["leased_until"],
                name="evaluation_unfinished_lease",
                condition=models.Q(state__in=["queued", "running"]),
            ),
        ]

    def __str__(self) -> str:
        return f"evaluation {self.pk}"


class EvaluationTransition(models.Model):
    evaluation = models.ForeignKey(Evaluation, on_delete=models.CASCADE, related_name="moves")
    from_state = models.CharField(max_length=10)
    to_state = models.CharField(max_length=10)
    reason = models.TextField(blank=True)
    actor = models.CharField(max_length=150, blank=True)
    version = models.PositiveIntegerField()
    at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.from_state} -> {self.to_state}"


class EvaluationTurn(models.Model):
    """One recorded turn, its replay and their comparison."""

    # No index of its own: evaluation_turn_once leads with it.
    evaluation = models.ForeignKey(
        Evaluation, on_delete=models.CASCADE, related_name="turns", db_index=False
    )
    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="+")
    turn = models.PositiveIntegerField()
    replay = models.ForeignKey(
        Session, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    trajectory_match = models.BooleanField(default=False)
    outcome_match = models.BooleanField(default=False)
    answer_exact = models.BooleanField(default=False)
    answer_similarity = models.FloatField(default=0.0)
    judge_score = models.FloatField(null=True, blank=True)
    # {"calls": [{"tool", "arguments"}], "outcome", "answer", "input_tokens", "output_tokens",
    #  "cost", "latency_ms"} (the candidate's also "would_have_called").
    baseline = models.JSONField(default=dict)
    candidate = models.JSONField(default=dict)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["evaluation", "session", "turn"], name="evaluation_turn_once"
            )
        ]

    def __str__(self) -> str:
        return f"{self.session_id} turn {self.turn}"
