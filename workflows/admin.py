"""Workflows in the admin: each drawn as a graph, edited as YAML with the same validation as
apply_config (errors inline, naming node and field; nothing saved), each save a new version."""

from typing import Any

import yaml
from django import forms
from django.contrib import admin
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe

from audit.edits import AuditedAdmin, admin_actor
from audit.models import AuditAction
from audit.services import admin_change_record
from configuration.documents import DocumentInvalid, document_load

from .definition import Definition, WorkflowInvalid
from .models import Workflow, WorkflowVersion
from .selectors import definition_check, version_svg, workflows_with_run_figures
from .services import workflow_apply

YAML_HELP = (
    "The workflow as in a config file's workflows: entry (see README, Workflows). Saving checks "
    "it as apply_config does and stores a new version; runs keep the version they started with."
)


def _current(workflow: Workflow) -> WorkflowVersion | None:
    if not workflow.pk or not workflow.current_version:
        return None
    return WorkflowVersion.objects.filter(
        workflow=workflow, number=workflow.current_version
    ).first()


class WorkflowForm(forms.ModelForm):
    definition_yaml = forms.CharField(
        label="Definition (YAML)",
        widget=forms.Textarea(
            attrs={"rows": 32, "cols": 110, "spellcheck": "false", "class": "wf-yaml"}
        ),
        help_text=YAML_HELP,
    )

    class Meta:
        model = Workflow
        fields = ["enabled"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        version = _current(self.instance)
        if version is not None:
            # As its author wrote it; a version stored before the text was kept is dumped.
            self.fields["definition_yaml"].initial = version.text or yaml.safe_dump(
                version.definition, sort_keys=False, allow_unicode=True, width=100
            )
        self.definition: Definition | None = None

    def clean_definition_yaml(self) -> str:
        text: str = self.cleaned_data["definition_yaml"]
        try:
            raw = document_load(text)
        except DocumentInvalid as exc:
            raise forms.ValidationError(str(exc)) from None
        if not isinstance(raw, dict):
            raise forms.ValidationError("the definition must be a mapping (slug, role, nodes, ...)")
        if self.instance.pk and raw.get("slug") != self.instance.slug:
            raise forms.ValidationError(
                f"slug: this workflow is '{self.instance.slug}'; a new slug is a new workflow (add one)"
            )
        slug = raw.get("slug") if isinstance(raw.get("slug"), str) else "?"
        try:
            self.definition = definition_check(raw, where=f"workflow {slug}")
        except WorkflowInvalid as exc:
            raise forms.ValidationError(exc.errors) from None
        return text.replace("\r\n", "\n")  # a browser's textarea sends CRLF


@admin.register(Workflow)
class WorkflowAdmin(AuditedAdmin, admin.ModelAdmin):
    form = WorkflowForm
    list_display = (
        "slug",
        "name",
        "role",
        "current_version",
        "enabled",
        "runs_link",
        "failed_link",
        "median_duration",
    )
    list_filter = ("enabled", "role")
    search_fields = ("slug", "name")
    readonly_fields = ("graph", "versions")

    def get_queryset(self, request: HttpRequest) -> QuerySet[Workflow]:
        return workflows_with_run_figures(super().get_queryset(request))

    def get_fields(self, request: HttpRequest, obj: Workflow | None = None) -> list[Any]:
        if obj is None:
            return ["definition_yaml"]
        return ["graph", "definition_yaml", "enabled", "versions"]

    @admin.display(description="Graph")
    def graph(self, obj: Workflow) -> SafeString:
        version = _current(obj)
        if version is None:
            return mark_safe("")  # noqa: S308  # nosec B308 B703
        # Drawn by our own code; every text in it is escaped there.
        svg = version_svg(version)
        return mark_safe(f'<div class="wf-graph" style="overflow-x:auto">{svg}</div>')  # noqa: S308  # nosec B308 B703

    @admin.display(description="Versions")
    def versions(self, obj: Workflow) -> str:
        rows = WorkflowVersion.objects.filter(workflow=obj).order_by("-number")[:20]
        return ", ".join(
            f"v{v.number} ({v.source}, {timezone.localtime(v.created_at):%Y-%m-%d %H:%M:%S})"
            for v in rows
        )

    @admin.display(description="Runs", ordering="run_count")
    def runs_link(self, obj: Workflow) -> str:
        url = (
            reverse("admin:agent_sessions_session_changelist")
            + f"?agent__id__exact={obj.runtime_agent_id}"
        )
        return format_html('<a href="{}">{}</a>', url, getattr(obj, "run_count", 0))

    @admin.display(description="Failed", ordering="failed_count")
    def failed_link(self, obj: Workflow) -> str:
        url = (
            reverse("admin:agent_sessions_session_changelist")
            + f"?agent__id__exact={obj.runtime_agent_id}&last_turn=error"
        )
        return format_html('<a href="{}">{}</a>', url, getattr(obj, "failed_count", 0))

    @admin.display(description="Median duration", ordering="median_s")
    def median_duration(self, obj: Workflow) -> str:
        seconds = getattr(obj, "median_s", None)
        if seconds is None:
            return "-"
        return f"{seconds:.1f} s" if seconds < 120 else f"{seconds / 60:.1f} min"

    def save_model(self, request: HttpRequest, obj: Workflow, form: Any, change: bool) -> None:
        """The definition is stored by the service (a new version, the runtime agent kept in
        step), never by saving the row as the form left it."""
        definition = form.definition
        assert definition is not None
        enabled = form.cleaned_data.get("enabled", True)
        was_enabled = (
            Workflow.objects.filter(pk=obj.pk).values_list("enabled", flat=True).first()
            if change
            else None
        )
        with transaction.atomic():
            workflow_apply(
                definition=definition,
                where=f"workflow {definition.slug}",
                source="admin",
                user=request.user,  # type: ignore[arg-type]
                text=form.cleaned_data["definition_yaml"],
            )
            saved = Workflow.objects.get(slug=definition.slug)
            if change and saved.enabled != enabled:
                Workflow.objects.filter(pk=saved.pk).update(enabled=enabled)
            if was_enabled is not None and was_enabled != enabled:
                admin_change_record(
                    actor=admin_actor(request),
                    user_id=request.user.pk,
                    obj=saved,
                    before={"enabled": was_enabled},
                    after={"enabled": enabled},
                    action=AuditAction.ADMIN_CHANGE,
                )
        obj.pk = saved.pk
        obj.slug = saved.slug

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        pass  # nothing related is edited here
