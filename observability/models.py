"""The sampled store of full prompts and answers: the only place they are kept whole.

A fraction of model calls (PROMPT_SAMPLE_RATE, default 1%) is written here,
request and response in full. Only superusers and staff holding the
`observability.view_promptsample` permission list it, and only those also holding
`view_prompt_content` read a request or response (admin.py); the API never serves it.
A staff user who is not a superuser sees only their own tenant's samples (the session's
owner, kept on the row).
"""

from django.conf import settings
from django.db import models


class PromptSample(models.Model):
    # The session's id, not a foreign key: this app knows nothing of sessions'
    # tables (a port), and a sample outlives nothing it must cascade with.
    session_id = models.UUIDField(db_index=True)
    # The session's owner (its tenant): who among the staff may list the sample. A user's
    # samples go with the user. None only for rows sampled before tenants were kept here:
    # superusers alone see those. The index below leads with it: no index of its own.
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="prompt_samples",
        db_index=False,
    )
    turn = models.PositiveIntegerField()
    iteration = models.PositiveIntegerField(help_text="The model call's round in its turn.")
    endpoint = models.CharField(max_length=100)
    model = models.CharField(max_length=200)
    trace_id = models.CharField(max_length=32, blank=True)
    request = models.JSONField(help_text="The messages and tools sent, in full.")
    response = models.JSONField(help_text="The text and tool calls received, in full.")
    input_tokens = models.PositiveIntegerField(default=0)
    output_tokens = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "prompt sample"
        indexes = [models.Index(fields=["owner", "-created_at"], name="prompt_sample_owner_at")]
        # "view" lists the samples; what was sent and received takes this one too.
        permissions = [("view_prompt_content", "Can view the full prompts and answers sampled")]

    def __str__(self) -> str:
        return f"{self.session_id} turn {self.turn} call {self.iteration}"
