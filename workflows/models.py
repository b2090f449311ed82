"""Workflows as stored: the definition by slug, and each validated version of it.

A run is a session (record.models.Session) that points at the version it started
with; editing a workflow writes a new version, so a run never changes under its feet.
"""

from django.conf import settings
from django.db import models


class Workflow(models.Model):
    slug = models.SlugField(max_length=100, unique=True)
    name = models.CharField(max_length=200, blank=True)
    description = models.TextField(blank=True)
    role = models.CharField(
        max_length=50,
        help_text="Its tool nodes run with this role; a key must hold it to start a run.",
    )
    # The agent a run's steps run as: its model endpoints serve llm and choice nodes, its
    # tools are the tools the nodes name. Kept in step by apply_config and the admin; never
    # offered as a conversational agent.
    runtime_agent = models.OneToOneField(
        "agent_sessions.Agent", on_delete=models.PROTECT, related_name="workflow"
    )
    current_version = models.PositiveIntegerField(default=0)
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug


class WorkflowVersion(models.Model):
    # No index of its own: the (workflow, number) constraint leads with it.
    workflow = models.ForeignKey(
        Workflow, on_delete=models.CASCADE, related_name="versions", db_index=False
    )
    number = models.PositiveIntegerField()
    # The mapping as declared (YAML as JSON): validated before it was stored.
    definition = models.JSONField()
    created_at = models.DateTimeField(auto_now_add=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    source = models.CharField(max_length=20, default="config", help_text="config | admin")
    # The YAML as its author wrote it (order and comments kept): what the admin's editor
    # shows. `definition` is its meaning; jsonb keeps neither order nor comments.
    text = models.TextField(blank=True, default="", db_default="")

    class Meta:
        ordering = ["workflow", "-number"]
        constraints = [
            models.UniqueConstraint(fields=["workflow", "number"], name="workflowversion_number")
        ]

    def __str__(self) -> str:
        return f"{self.workflow.slug} v{self.number}"


class WorkflowPicture(models.Model):
    """A version's graph, drawn once when the version is stored (workflows/graph_svg.py's
    Picture as JSON): every page and request that shows it, a run's too, reads it instead
    of laying the graph out again. A row of its own, so that loading a version (every run
    does) does not load its drawing."""

    version = models.OneToOneField(
        WorkflowVersion, on_delete=models.CASCADE, primary_key=True, related_name="picture"
    )
    # graph_svg.REVISION it was drawn with: an older drawing is drawn again, not shown.
    revision = models.PositiveSmallIntegerField()
    drawing = models.JSONField()
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"picture of version {self.version_id}"
