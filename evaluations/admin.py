"""The evaluations' admin: start one (recorded sessions by id or filter, a candidate), follow
its progress, read its totals and the turns that differ first with their calls and answers
side by side, cancel it. Its pages render what selectors.py reads; writes go to services."""

import json
from typing import Any, cast

from django import forms
from django.contrib import admin
from django.contrib.auth.models import User
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from accounts.admin_access import MESSAGE_CONTENT, hidden_text, holds, may_view
from accounts.tenancy import TenantScopedAdmin
from audit.edits import AuditedAdmin, admin_actor
from record.errors import DomainError
from record.models import Agent, ModelEndpoint
from workflows.models import WorkflowVersion

from . import selectors, services
from .models import Evaluation


class EvaluationAddForm(forms.ModelForm):
    """What to replay (ids, or a filter over the sessions the user may see) and on what."""

    # Set per request by EvaluationAdmin.get_form: whose sessions may be picked (None: a
    # superuser's, any owner's) and whether a message's text may be searched.
    tenant_id: int | None = None
    may_search_content = False  # closed unless get_form says the user holds the permission

    session_ids = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 80}),
        help_text="Recorded session ids, one per line or comma-separated; or the filter below.",
    )
    agent_slug = forms.ModelChoiceField(
        queryset=Agent.objects.filter(enabled=True, workflow__isnull=True),
        required=False,
        to_field_name="slug",
        label="agent",
    )
    since = forms.DateField(required=False, help_text="YYYY-MM-DD")
    until = forms.DateField(required=False, help_text="YYYY-MM-DD")
    outcome = forms.ChoiceField(
        required=False,
        choices=[("", "any")]
        + [(o, o) for o in selectors.OUTCOMES]
        + [(o, f"{o} (a workflow run)") for o in selectors.RUN_OUTCOMES],
    )
    search = forms.CharField(required=False, max_length=200, help_text="Text in a message.")
    candidate_model = forms.ModelChoiceField(
        queryset=ModelEndpoint.objects.all(), required=False, to_field_name="name"
    )
    candidate_system_prompt = forms.CharField(
        required=False, widget=forms.Textarea(attrs={"rows": 4, "cols": 80})
    )
    candidate_workflow_version = forms.ModelChoiceField(
        queryset=WorkflowVersion.objects.select_related("workflow").order_by(
            "workflow__slug", "-number"
        ),
        required=False,
        label="candidate workflow version",
        help_text="Replays recorded runs of its workflow (by id, or the dates and outcome "
        "below) on this version instead of conversations.",
    )
    candidate_agent_version = forms.CharField(
        required=False,
        max_length=120,
        help_text="One of the agent's configuration versions, <slug>@<number> (the agent's "
        "page lists them), e.g. support@3.",
    )
    judge_model = forms.ModelChoiceField(
        queryset=ModelEndpoint.objects.filter(enabled=True), required=False, to_field_name="name"
    )
    judge_rubric = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 3}))

    class Meta:
        model = Evaluation
        fields = ("allow_read_only_calls", "budget_cost")

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        model, prompt = data.get("candidate_model"), (data.get("candidate_system_prompt") or "")
        workflow_version = data.get("candidate_workflow_version")
        agent_version = (data.get("candidate_agent_version") or "").strip()
        given = [bool(model), bool(prompt.strip()), bool(workflow_version), bool(agent_version)]
        if given.count(True) != 1:
            raise forms.ValidationError(
                "Give a candidate model, a candidate system prompt, a candidate agent version "
                "or a candidate workflow version (one)."
            )
        if workflow_version is not None:
            data["candidate"] = {
                selectors.WORKFLOW_VERSION: (
                    f"{workflow_version.workflow.slug}@{workflow_version.number}"
                )
            }
        elif agent_version:
            data["candidate"] = {"agent_version": agent_version}
        else:
            data["candidate"] = {"model": model.name} if model else {"system_prompt": prompt}
        if bool(data.get("judge_model")) != bool((data.get("judge_rubric") or "").strip()):
            raise forms.ValidationError("A judge needs both a model and a rubric.")
        ids = [p for p in (data.get("session_ids") or "").replace(",", " ").split() if p]
        where = selectors.SessionFilter(
            agent=data["agent_slug"].slug if data.get("agent_slug") else None,
            since=data.get("since"),
            until=data.get("until"),
            outcome=data.get("outcome") or None,
            search=data.get("search") or None,
        )
        if data.get("search") and not self.may_search_content:
            # Which sessions a text search finds would tell what they say.
            self.add_error("search", hidden_text(MESSAGE_CONTENT))
            return data
        try:
            # A superuser evaluates any owner's sessions; other staff only their tenant's
            # (another owner's id is "not found", as over REST).
            data["picked"] = selectors.sessions_pick(
                owner_id=self.tenant_id,
                ids=ids or None,
                where=None if ids else where,
                workflow=selectors.candidate_workflow(data["candidate"]),
            )
            services.evaluation_check(
                sessions=data["picked"],
                candidate=data["candidate"],
                judge=_judge(data),
                budget_cost=data.get("budget_cost"),
            )
        except DomainError as exc:
            raise forms.ValidationError(exc.message) from None
        return data


def _judge(data: dict[str, Any]) -> dict[str, str] | None:
    model = data.get("judge_model")
    return {"model": model.name, "rubric": data.get("judge_rubric") or ""} if model else None


def _totals(obj: Evaluation) -> SafeString:
    return format_html_join(
        "", "<tr><th>{}</th><td>{}</td></tr>", ((k, v) for k, v in (obj.totals or {}).items())
    )


def _call_text(call: dict[str, Any]) -> str:
    return f"{call['tool']}({json.dumps(call['arguments'], ensure_ascii=False, sort_keys=True)})"


def _side(data: dict[str, Any], other: dict[str, Any], candidate: bool = False) -> dict[str, Any]:
    """One side of a turn as the report shows it: each call marked when the other side did
    not make it (by tool and arguments), the candidate's calls of another agent marked
    "from the record" (a replay never runs that agent's model), the answer whole (the page
    wraps it)."""
    theirs = {_call_text(c) for c in other.get("calls", [])}
    calls = data.get("calls", [])
    recorded = selectors.replay_calls_from_record(data) if candidate else [False] * len(calls)
    return {
        "calls": [
            {"text": _call_text(c), "differs": _call_text(c) not in theirs, "from_record": r}
            for c, r in zip(calls, recorded, strict=True)
        ],
        "outcome": data.get("outcome", ""),
        "answer": data.get("answer", ""),
        "cost": data.get("cost"),
        "latency_ms": data.get("latency_ms"),
        "would_have_called": [_call_text(c) for c in data.get("would_have_called") or []],
        # A workflow run's side: the nodes it visited, in order.
        "path": " → ".join(data.get("path") or []),
    }


@admin.register(Evaluation)
class EvaluationAdmin(AuditedAdmin, TenantScopedAdmin, admin.ModelAdmin):
    """A staff user who is not a superuser sees and starts only their own tenant's
    evaluations, over their tenant's sessions; the turns' calls and answers need
    view_message_content, as the sessions' do. Starting and cancelling are audited by the
    services; a delete by AuditedAdmin (its own save_model starts one through the service)."""

    list_display = ("id", "agent", "candidate_shown", "state", "progress", "scores", "created_at")
    list_filter = ("state", "agent")
    list_select_related = ("agent",)
    actions = ("cancel",)

    def get_form(
        self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any
    ) -> Any:
        if obj is None:
            kwargs["form"] = type(
                "EvaluationAddForm",
                (EvaluationAddForm,),
                {
                    "tenant_id": None if request.user.is_superuser else request.user.pk,
                    "may_search_content": holds(request, MESSAGE_CONTENT),
                },
            )
        return super().get_form(request, obj, change=change, **kwargs)

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is None:
            return (
                "session_ids",
                ("agent_slug", "since", "until", "outcome"),
                "search",
                "candidate_model",
                "candidate_system_prompt",
                "candidate_agent_version",
                "candidate_workflow_version",
                "allow_read_only_calls",
                "budget_cost",
                ("judge_model", "judge_rubric"),
            )
        report = "report" if holds(request, MESSAGE_CONTENT) else "report_masked"
        if report == "report" and not may_view(request, "agent_sessions.session"):
            # The sessions' pages would answer 403: their ids as text, no links.
            report = "report_unlinked"
        return (
            "state",
            "progress",
            "resumes",
            "candidate_shown",
            "recorded_on",
            "actor",
            "error",
            report,
        )

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return () if obj is None else self.get_fields(request, obj)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False if obj is not None else super().has_change_permission(request, obj)

    def add_view(
        self, request: HttpRequest, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> Any:
        # An evaluation is never edited (its page is read-only): no "Save and continue
        # editing", which would lead there as if it could be.
        context = {**(extra_context or {}), "show_save_and_continue": False}
        return super().add_view(request, form_url, context)

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        data = form.cleaned_data
        # The form asked evaluation_check already: this does not refuse.
        created = services.evaluation_create(
            owner=cast(User, request.user),  # the admin's: a staff user
            actor=admin_actor(request),
            sessions=data["picked"],
            candidate=data["candidate"],
            allow_read_only_calls=bool(data.get("allow_read_only_calls")),
            judge=_judge(data),
            budget_cost=data.get("budget_cost"),
        )
        form.instance = created
        obj.pk = created.pk

    def get_queryset(self, request: HttpRequest) -> QuerySet[Evaluation]:
        return super().get_queryset(request).select_related("agent")

    @admin.action(description="Cancel the selected evaluations", permissions=["change"])
    def cancel(self, request: HttpRequest, queryset: QuerySet[Evaluation]) -> None:
        stopped = 0
        for evaluation in queryset:
            try:
                services.evaluation_cancel(evaluation=evaluation, actor=admin_actor(request))
                stopped += 1
            except DomainError:
                continue
        self.message_user(request, f"{stopped} evaluation(s) cancelled.")

    @admin.display(description="candidate")
    def candidate_shown(self, obj: Evaluation) -> str:
        kind, value = next(iter((obj.candidate or {"?": ""}).items()))
        return f"{kind}: {str(value)[:60]}"

    @admin.display(description="baseline recorded on")
    def recorded_on(self, obj: Evaluation) -> str:
        """The agent versions the recorded turns ran on, beside the candidate."""
        return ", ".join(selectors.evaluation_recorded_on(obj)) or "—"

    @admin.display(description="progress")
    def progress(self, obj: Evaluation) -> str:
        return f"{obj.done}/{obj.total}"

    @admin.display(description="scores")
    def scores(self, obj: Evaluation) -> str:
        t = obj.totals or {}
        if not t.get("turns"):
            return "—"
        shown = [
            f"{label} {t[key]:.0%}"
            for key, label in (("trajectory_match", "trajectory"), ("outcome_match", "outcome"))
            if isinstance(t.get(key), (int, float))
        ]
        shown += [
            f"{label} {t[key]}"
            for key, label in (
                ("answer_similarity", "answer"),
                ("cost_ratio", "cost ×"),
                ("would_have_called", "would have called"),
            )
            if t.get(key) is not None
        ]
        return ", ".join(shown)

    @admin.display(description="report")
    def report_masked(self, obj: Evaluation) -> SafeString:
        """The totals; the turns' calls and answers are what the sessions said."""
        return format_html(
            "<table>{}</table><p>{}</p>",
            _totals(obj),
            f"The turns: {hidden_text(MESSAGE_CONTENT)}",
        )

    @admin.display(description="report")
    def report_unlinked(self, obj: Evaluation) -> SafeString:
        """The report for who may not view sessions: no links to their pages."""
        return self.report(obj, linked=False)

    @admin.display(description="report")
    def report(self, obj: Evaluation, linked: bool = True) -> SafeString:
        """Totals, then every turn (those that differ first): the calls and the answers of
        the record and of the candidate side by side, each turn linked to its session and
        its replay (`linked`)."""
        turns = []
        for turn in selectors.evaluation_turns(obj):
            same = turn.trajectory_match and turn.outcome_match
            turns.append(
                {
                    "row": turn,
                    "same": same,
                    "session_url": reverse(
                        "admin:agent_sessions_session_change", args=[turn.session_id]
                    )
                    if linked
                    else "",
                    "replay_url": reverse(
                        "admin:agent_sessions_session_change", args=[turn.replay_id]
                    )
                    if turn.replay_id and linked
                    else "",
                    "baseline": _side(turn.baseline, turn.candidate),
                    "candidate": _side(turn.candidate, turn.baseline, candidate=True),
                    "answers_differ": turn.baseline.get("answer") != turn.candidate.get("answer"),
                }
            )
        return mark_safe(  # noqa: S308 - the template escapes every value
            render_to_string(
                "admin/evaluations/report.html",
                {"totals": sorted((obj.totals or {}).items()), "turns": turns},
            )
        )
