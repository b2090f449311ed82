import uuid
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import Q

from .states import CHANGEABLE, ApprovalStatus, Outcome

DEFAULT_GROUP = "approvers"


# The tool names of workflows' reviews (workflows/node_tools.py: review_tool_name).
WORKFLOW_REVIEW_PREFIX = "workflow.review."


class ApprovalKind(models.TextChoices):
    TOOL_CALL = "tool_call", "tool call"
    RECOVERY_REVIEW = "recovery_review", "recovery review"


class ReviewAnswer(models.TextChoices):
    """A person's answer to a recovery review: did the uncertain call take effect?"""

    TOOK_EFFECT = "took_effect", "it took effect"
    NOT_TAKEN = "not_taken", "it did not take effect"
    SEND_AGAIN = "send_again", "send it again"


class OnTimeout(models.TextChoices):
    REJECT = "reject"
    APPROVE = "approve"
    ESCALATE = "escalate"


class Approval(models.Model):
    """One decision a person owes: a gated tool call, or a review of an uncertain one."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # No index of its own: approval_session_step leads with it.
    session = models.ForeignKey(
        "agent_sessions.Session",
        on_delete=models.CASCADE,
        related_name="approvals",
        db_index=False,
    )
    # A call has at most one gating approval, and a review each time it turned out uncertain.
    tool_call = models.ForeignKey(
        "agent_sessions.ToolCall",
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="approvals",
    )
    kind = models.CharField(
        max_length=20, choices=ApprovalKind.choices, default=ApprovalKind.TOOL_CALL
    )
    turn = models.PositiveIntegerField(default=0)
    step = models.PositiveIntegerField(default=0, help_text="The session step that made the call.")
    tool_name = models.CharField(max_length=100, blank=True)
    arguments = models.JSONField(default=dict, blank=True, help_text="As the model sent them.")
    edited_arguments = models.JSONField(
        null=True, blank=True, help_text="As the approver changed them (what runs)."
    )
    risk_level = models.PositiveSmallIntegerField(null=True, blank=True)
    reason = models.TextField(blank=True, help_text="Why a person must decide.")
    status = models.CharField(
        max_length=10,
        choices=[(s.value, s.value) for s in ApprovalStatus],
        default=ApprovalStatus.PENDING.value,
    )
    group = models.CharField(max_length=50, default=DEFAULT_GROUP)
    on_timeout = models.CharField(
        max_length=10, choices=OnTimeout.choices, default=OnTimeout.REJECT
    )
    escalate_to = models.CharField(max_length=50, blank=True)
    escalations = models.PositiveSmallIntegerField(default=0)
    timeout_s = models.PositiveIntegerField(default=1800, help_text="Each deadline's length.")
    requested_at = models.DateTimeField(auto_now_add=True)
    deadline = models.DateTimeField()
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="approvals_decided",
    )
    decided_by_name = models.CharField(
        max_length=150, blank=True, help_text="Who decided; 'system' for a deadline policy."
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    comment = models.TextField(blank=True)
    remember = models.BooleanField(
        default=False, help_text="Approved for the rest of the session: same tool, same arguments."
    )
    version = models.PositiveIntegerField(default=0)
    answer = models.CharField(
        max_length=20,
        choices=ReviewAnswer.choices,
        blank=True,
        help_text="A recovery review's answer.",
    )
    answer_result = models.JSONField(
        null=True, blank=True, help_text="The call's result, as the reviewer gave it (took effect)."
    )

    class Meta:
        ordering = ["requested_at"]
        # Deciding in the admin needs this on top of an approver's rights (their groups);
        # the REST API stays with approver rights alone.
        permissions = [
            ("decide_approval", "Can approve or reject approvals in the admin (as an approver)")
        ]
        indexes = [
            models.Index(
                fields=["deadline"], name="approval_pending_deadline", condition=Q(status="pending")
            ),
            models.Index(fields=["session", "turn", "step"], name="approval_session_step"),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["tool_call"], condition=Q(kind="tool_call"), name="approval_one_per_call"
            )
        ]

    def __str__(self) -> str:
        return f"{self.tool_name or self.kind} ({self.status})"

    @property
    def review(self) -> dict[str, Any] | None:
        """A workflow's review (its human node): what the card says is decided, as the
        node wrote it (workflow, node, title, summary, the values it shows and those the
        approver may edit); None for an ordinary tool call."""
        if not self.tool_name.startswith(WORKFLOW_REVIEW_PREFIX):
            return None
        arguments = self.arguments if isinstance(self.arguments, dict) else {}
        show = arguments.get("show")
        editable = arguments.get("editable")
        return {
            "workflow": str(arguments.get("workflow", "")),
            "run": str(self.session_id),
            "node": str(arguments.get("node", self.tool_name[len(WORKFLOW_REVIEW_PREFIX) :])),
            "title": str(arguments.get("title") or self.tool_name[len(WORKFLOW_REVIEW_PREFIX) :]),
            "summary": str(arguments.get("summary", "")),
            "show": show if isinstance(show, dict) else {},
            "editable": editable if isinstance(editable, dict) else {},
        }

    @property
    def undo_until(self) -> datetime | None:
        """Until when a person's decision on a call may be undone (APPROVAL_UNDO_S from the
        decision; the service judges by the session's lease); None for anything else."""
        if (
            self.status not in CHANGEABLE
            or self.kind != ApprovalKind.TOOL_CALL
            or self.decided_by_id is None
            or self.decided_at is None
            or self.answer
            or not settings.APPROVAL_UNDO_S
        ):
            return None
        return self.decided_at + timedelta(seconds=settings.APPROVAL_UNDO_S)

    @property
    def editable_arguments(self) -> Any:
        """What an approver may edit: a review's `editable` values, else all the arguments."""
        review = self.review
        return self.arguments if review is None else review["editable"]


class ApprovalTransition(models.Model):
    """Every move of an approval: who (or the system), when, what they said and changed."""

    approval = models.ForeignKey(Approval, on_delete=models.CASCADE, related_name="transitions")
    from_status = models.CharField(max_length=10)
    to_status = models.CharField(max_length=10)
    outcome = models.CharField(max_length=10, choices=[(o.value, o.value) for o in Outcome])
    actor = models.CharField(max_length=150)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True
    )
    comment = models.TextField(blank=True)
    arguments = models.JSONField(null=True, blank=True, help_text="Edited arguments, if any.")
    group = models.CharField(max_length=50, blank=True)
    version = models.PositiveIntegerField()
    at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.from_status} -> {self.to_status} ({self.outcome} by {self.actor})"
