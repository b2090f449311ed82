"""The audit trail: one row per human action (and per decision the system makes in a
person's place, such as an approval's deadline policy), written in the transaction of the
action itself, never edited."""

from django.conf import settings
from django.db import models
from django.utils import timezone


class AuditAction(models.TextChoices):
    APPROVAL_APPROVED = "approval.approved", "approval approved"
    APPROVAL_EDITED = "approval.edited", "approval approved with edited arguments"
    APPROVAL_REJECTED = "approval.rejected", "approval rejected"
    APPROVAL_WITHDRAWN = "approval.withdrawn", "approval decision withdrawn (pending again)"
    APPROVAL_CHANGED = "approval.changed", "approval decision changed"
    APPROVAL_EXPIRED = "approval.expired", "approval deadline applied by the system"
    REVIEW_ANSWERED = "review.answered", "recovery review answered"
    SESSION_FORK = "session.fork", "session forked"
    SESSION_RESUME = "session.resume", "session resumed"
    SESSION_CANCEL = "session.cancel", "turn cancelled"
    SESSION_FORCE_FINISH = "session.force_finish", "turn force-finished by an operator"
    SESSION_REPLY = "session.reply", "operator replied"
    SESSION_HAND_BACK = "session.hand_back", "handed back to the agent"
    SESSION_TOOL_RUN = "session.tool_run", "tool run by hand"
    CREDITS_GRANT = "credits.grant", "credits granted"
    CREDITS_ADJUST = "credits.adjust", "credits adjusted"
    CREDITS_SETTINGS = "credits.settings", "credit account settings changed"
    ADMIN_ADD = "admin.add", "added in the admin"
    ADMIN_CHANGE = "admin.change", "changed in the admin"
    ADMIN_DELETE = "admin.delete", "deleted in the admin"
    BREAKER_RESET = "breaker.reset", "circuit breaker reset"
    MCP_REFRESH_QUEUED = "mcp.refresh_queued", "MCP server refresh queued"
    MCP_REFRESHED = "mcp.refreshed", "MCP server refreshed (or failed to)"
    API_KEY_CREATE = "apikey.create", "API key created"
    API_KEY_REVOKE = "apikey.revoke", "API key revoked"
    APPROVER_GRANT = "approver.grant", "approver rights granted"
    MEMORY_ERASE = "memory.erase", "memory of a user erased"
    CONFIG_APPLY = "config.apply", "configuration file applied"
    ROLLOUT_OVERRIDE = "rollout.override", "candidate_percent raised past the rollout gate"
    EVALUATION_CREATE = "evaluation.create", "evaluation started"
    EVALUATION_CANCEL = "evaluation.cancel", "evaluation cancelled"


class AuditEntry(models.Model):
    """Who did what to which object, when, with the difference it made and why."""

    at = models.DateTimeField(default=timezone.now, verbose_name="date")
    actor = models.CharField(
        max_length=150,
        help_text="As the action recorded it: admin:NAME (the admin), api:NAME (a key), "
        "cli:NAME or deploy:NAME (a management command run by that OS user, or as its --actor "
        "says) or system.",
    )
    # The indexes below lead with these: no index of their own.
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="audit_entries",
        db_index=False,
    )
    key_prefix = models.CharField(
        max_length=12, blank=True, help_text="The API key's prefix, when a key acted."
    )
    action = models.CharField(max_length=40, choices=AuditAction.choices)
    object_type = models.CharField(max_length=60, help_text="The model's label, e.g. tools.tool.")
    object_id = models.CharField(max_length=64)
    object_repr = models.CharField(max_length=200, blank=True)
    # The tenant whose object it is (None for the platform's own: agents, tools, models).
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="audit_entries_owned",
        db_index=False,
    )
    before = models.JSONField(null=True, blank=True, help_text="The changed fields, before.")
    after = models.JSONField(null=True, blank=True, help_text="The changed fields, after.")
    reason = models.TextField(blank=True, help_text="The comment or reason given.")
    data = models.JSONField(default=dict, blank=True)

    class Meta:
        verbose_name = "audit entry"
        verbose_name_plural = "audit entries"
        ordering = ["-at", "-id"]
        indexes = [
            models.Index(fields=["-at"], name="audit_at"),
            models.Index(fields=["action", "-at"], name="audit_action_at"),
            models.Index(fields=["object_type", "object_id"], name="audit_object"),
            models.Index(fields=["user", "-at"], name="audit_user_at"),
            models.Index(fields=["owner", "-at"], name="audit_owner_at"),
        ]

    def __str__(self) -> str:
        what = self.object_repr or f"{self.object_type} {self.object_id}"
        return f"{self.get_action_display()}: {what}, by {self.actor}"
