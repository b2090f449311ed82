"""Agents: their model and rollout, loop guards, tools and offline rules."""

from typing import Any

from django import forms
from django.contrib import admin
from django.contrib.admin.widgets import FilteredSelectMultiple
from django.db.models import Count, QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from jsonschema import Draft202012Validator

from audit.edits import AuditedAdmin, admin_actor
from configuration.schema import RULE, routing_rule_problems
from evaluations.gate import GateVerdict, rollout_gate_judge, rule_problem
from evaluations.services import rollout_override_audit
from memory.budget import budget_problems
from memory.dialogue import dialogue_config_problem
from record.models import Agent, AgentVersion
from runtime.peak_hours import peak_hours_problems, time_zone
from tools.execution import BUILTIN_TOOLS
from tools.forms import JSON_FIELD, optional_count_field
from tools.models import Tool

from .. import selectors
from ..services.agent_versions import agent_version_record
from .display import pre

_rules_validator = Draft202012Validator({"type": "array", "items": RULE})
# Another agent as a tool (engine/gates/children.py names it the same way).
AGENT_TOOL_PREFIX = "agent."
# The configuration versions the agent's page lists (the newest).
VERSIONS_SHOWN = 20


def tool_choices(current: list[str], own_slug: str = "") -> list[tuple[str, str]]:
    """Every tool an agent may list: the tools (a disabled one says so), the built-ins, and
    the other agents as tools (`agent.<slug>`); a listed name that is none of these stays,
    marked, so the form shows what the agent has."""
    rows = Tool.objects.order_by("name").values_list("name", "enabled", "side_effects")
    choices = [
        (name, name + (" (side effects)" if effects else "") + ("" if enabled else " (disabled)"))
        for name, enabled, effects in rows
    ]
    choices += [(name, f"{name} (built in)") for name in sorted(BUILTIN_TOOLS)]
    choices += [
        (f"{AGENT_TOOL_PREFIX}{slug}", f"{AGENT_TOOL_PREFIX}{slug} (another agent)")
        for slug in Agent.objects.filter(workflow__isnull=True)
        .exclude(slug=own_slug)
        .order_by("slug")
        .values_list("slug", flat=True)
    ]
    known = {name for name, _ in choices}
    return choices + [(name, f"{name} (unknown)") for name in current if name not in known]


class AgentAdminForm(forms.ModelForm):
    # The known tools to pick from, not a comma-separated text field.
    tools = forms.MultipleChoiceField(
        required=False,
        label="",  # the fieldset and the picker's two panes name it
        widget=FilteredSelectMultiple("tools", is_stacked=False),
        help_text="The tools the agent's model may call (each still gated by the session's role).",
    )
    override_rollout_gate = forms.BooleanField(
        required=False,
        help_text="Superusers only: raise candidate_percent although the rollout gate refuses "
        "(audited, with the reason below).",
    )
    override_reason = forms.CharField(required=False, max_length=500)
    # Set by AgentAdmin.get_form: whether the user may override the rollout gate.
    may_override = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        current = list(self.instance.tools or []) if self.instance.pk else []
        self.fields["tools"].choices = tool_choices(current, own_slug=self.instance.slug or "")

    class Meta:
        model = Agent
        fields = (
            "slug",
            "name",
            "enabled",
            "system_prompt",
            "model",
            "fallback_model",
            "candidate_model",
            "candidate_percent",
            "rollout_gate",
            "context_window",
            "context_budget",
            "summary_model",
            "max_iterations",
            "repeat_call_limit",
            "same_result_limit",
            "step_timeout_s",
            "turn_timeout_s",
            "tools",
            "rules",
            "dialogue",
            "busy_message",
            "cheap_model",
            "degraded_max_tokens",
            "budget_turn_tokens",
            "budget_turn_cost",
            "budget_session_tokens",
            "budget_session_cost",
            "budget_day_tokens",
            "budget_day_cost",
        )
        widgets = {
            "system_prompt": forms.Textarea(attrs={"rows": 8, "cols": 100}),
        }

    def clean_tools(self) -> list[str]:
        names: list[str] = list(self.cleaned_data.get("tools") or [])
        known = set(Tool.objects.filter(name__in=names).values_list("name", flat=True))
        known |= set(BUILTIN_TOOLS)
        known |= {
            f"{AGENT_TOOL_PREFIX}{slug}"
            for slug in Agent.objects.filter(workflow__isnull=True).values_list("slug", flat=True)
        }
        unknown = [name for name in names if name not in known]
        if unknown:
            raise forms.ValidationError(f"Unknown tool(s): {', '.join(unknown)}.")
        if len(set(names)) != len(names):
            raise forms.ValidationError("A tool is listed twice.")
        return names

    def clean_dialogue(self) -> Any:
        dialogue = self.cleaned_data.get("dialogue")
        if dialogue in (None, ""):
            return {}
        problem = dialogue_config_problem(dialogue)
        if problem:
            raise forms.ValidationError(f"Invalid dialogue config at {problem}")
        return dialogue

    def clean_context_budget(self) -> Any:
        budget = self.cleaned_data.get("context_budget")
        if budget in (None, ""):
            return {}
        problems = budget_problems(budget)
        if problems:
            raise forms.ValidationError(f"Invalid context budget: {'; '.join(problems)}.")
        return budget

    def clean_routing(self) -> Any:
        routing = self.cleaned_data.get("routing") or {}
        if not routing:
            return {}
        if not isinstance(routing, dict) or not routing.get("small") or not routing.get("when"):
            raise forms.ValidationError('routing needs "small" (a model endpoint) and "when" (CEL)')
        problems = routing_rule_problems(str(routing["when"]))
        if problems:
            raise forms.ValidationError(f"when: {problems[0]}")
        return routing

    def clean_peak_hours(self) -> list[str]:
        windows = [w.strip() for w in self.cleaned_data.get("peak_hours") or []]
        problems = peak_hours_problems(windows)
        if problems:
            raise forms.ValidationError(f"peak_hours{'; peak_hours'.join(problems)}")
        return windows

    def clean_timezone(self) -> str:
        zone = (self.cleaned_data.get("timezone") or "").strip()
        if zone and time_zone(zone) is None:
            raise forms.ValidationError(
                f"Unknown time zone {zone!r} (an IANA name, e.g. Asia/Shanghai)."
            )
        return zone

    def clean_rollout_gate(self) -> Any:
        rules = self.cleaned_data.get("rollout_gate")
        if rules in (None, ""):
            return {}
        if not isinstance(rules, dict):
            raise forms.ValidationError('rules like {"trajectory_match": ">= 0.9"}')
        problems = [p for m, r in rules.items() if (p := rule_problem(m, r))]
        if problems:
            raise forms.ValidationError("; ".join(problems))
        return rules

    def clean(self) -> dict[str, Any]:
        """A raise of candidate_percent needs the candidate's latest evaluation to pass the
        agent's rollout gate (evaluations/gate.py), or a superuser's override with a reason."""
        data = super().clean() or {}
        self.gate_verdict: GateVerdict | None = None
        before = self.instance.candidate_percent if self.instance.pk else 0
        after = data.get("candidate_percent")
        if not self.instance.pk or after is None or after <= before or "rollout_gate" not in data:
            return data
        probe = Agent(pk=self.instance.pk, rollout_gate=data.get("rollout_gate") or {})
        candidate = data.get("candidate_model")
        verdict = rollout_gate_judge(probe, candidate_model=candidate.name if candidate else None)
        if verdict.passed:
            return data
        if not data.get("override_rollout_gate"):
            self.add_error("candidate_percent", verdict.message())
        elif not self.may_override:
            self.add_error(
                "override_rollout_gate", "Only a superuser may override the rollout gate."
            )
        elif not (data.get("override_reason") or "").strip():
            self.add_error("override_reason", "Say why the gate is overridden.")
        else:
            self.gate_verdict = verdict
        return data

    def clean_rules(self) -> Any:
        rules = self.cleaned_data.get("rules")
        if rules in (None, ""):
            return []
        errors = sorted(
            _rules_validator.iter_errors(rules), key=lambda e: list(map(str, e.absolute_path))
        )
        if errors:
            first = errors[0]
            where = "".join(f"[{p}]" for p in first.absolute_path) or "(top level)"
            raise forms.ValidationError(f"Invalid rules at {where}: {first.message}")
        return rules


@admin.register(Agent)
class AgentAdmin(AuditedAdmin, admin.ModelAdmin):
    form = AgentAdminForm
    formfield_overrides = JSON_FIELD
    list_display = (
        "slug",
        "name",
        "model",
        "fallback_model",
        "rollout",
        "tool_count",
        "max_iterations",
        "enabled",
        "session_count",
    )
    list_filter = ("enabled", "model")
    list_select_related = ("model", "fallback_model", "candidate_model")
    search_fields = ("slug", "name", "system_prompt")
    readonly_fields = (
        "created_at",
        "updated_at",
        "routing_figures",
        "candidate_evaluation",
        "configuration_versions",
    )
    fieldsets = (
        (None, {"fields": ("slug", "name", "enabled", "system_prompt")}),
        (
            "Model",
            {
                "fields": (
                    "model",
                    "fallback_model",
                    "candidate_model",
                    ("candidate_percent", "candidate_evaluation"),
                    "rollout_gate",
                    ("override_rollout_gate", "override_reason"),
                    "context_window",
                ),
                "description": "Edits apply at the next step of every session. The candidate model gets "
                "candidate_percent of sessions (sticky per session) for a gradual rollout. The "
                'rollout gate, e.g. {"trajectory_match": ">= 0.9", "cost_ratio": "<= 1.2"}, is '
                "what the candidate's latest evaluation must show before the percentage rises.",
            },
        ),
        (
            "Loop guards and time limits",
            {
                "fields": (
                    "max_iterations",
                    "repeat_call_limit",
                    "same_result_limit",
                    "step_timeout_s",
                    "turn_timeout_s",
                )
            },
        ),
        (
            "Budgets and degradation",
            {
                "fields": (
                    ("budget_turn_tokens", "budget_turn_cost"),
                    ("budget_session_tokens", "budget_session_cost"),
                    ("budget_day_tokens", "budget_day_cost"),
                    "cheap_model",
                    "degraded_max_tokens",
                ),
                "description": "Empty budgets do not limit. A call that would cross one ends the "
                "turn with budget_exceeded. From degradation level 1 the cheap model (else the "
                "fallback) answers with at most degraded_max_tokens.",
            },
        ),
        (
            "Context budget and summaries",
            {
                "fields": ("context_budget", "summary_model"),
                "description": "Partitions of the window (system, memory, history, input, buffer) "
                'in tokens, or shares below 1, e.g. {"history": 32000}; trim_at and summarise_at '
                "move the two watermarks (0.6 and 0.9 of the history), summarise_ahead_at where "
                "a summary is prepared in the background (0.6). Summaries use the summary "
                "model, else the cheap model, else the fallback, else the model.",
            },
        ),
        (
            "Tools",
            {
                "fields": ("tools",),
                "description": "Pick from the known tools: this platform's, the built-ins, "
                "and the other agents (agent.SLUG).",
            },
        ),
        (
            "Agents together and model routing",
            {
                "fields": ("handoffs", "max_depth", "routing", "routing_figures"),
                "description": "agent.<slug> in its tools asks another agent (a child session); "
                "handoffs lets it hand the conversation over (transfer_to_<slug>); routing sends "
                'turns whose CEL rule holds to a small model, e.g. {"small": "cheap", "when": '
                '"length < 300", "escalate_on": ["invalid_tool_call"]} (README, "Agents together").',
            },
        ),
        (
            "Environment",
            {
                "fields": ("peak_hours", "timezone"),
                "description": "Peak hours, comma-separated (09:00-12:00,14:00-18:00), in the "
                "agent's time zone: the model sees is_peak_hour, and a flip between a pause "
                "and the run's continuation is a drift (docs, memory-and-context).",
            },
        ),
        ("Offline rules model", {"fields": ("rules",), "classes": ("collapse",)}),
        ("Dialogue state", {"fields": ("dialogue",), "classes": ("collapse",)}),
        ("Other", {"fields": ("busy_message", "created_at", "updated_at")}),
        (
            "Configuration versions",
            {
                "fields": ("configuration_versions",),
                "classes": ("collapse",),
                "description": "Every change of the configuration (apply_config, this form) "
                "stores a version; an evaluation's candidate "
                '{"agent_version": "<slug>@<number>"} replays one.',
            },
        ),
    )

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        """The rollout gate's override is a superuser's alone: not shown to anyone else (to a
        view-only user it would read "None")."""
        fieldsets = super().get_fieldsets(request, obj)
        if getattr(request.user, "is_superuser", False):
            return fieldsets
        override = ("override_rollout_gate", "override_reason")
        return [
            (name, {**opts, "fields": tuple(f for f in opts["fields"] if f != override)})
            for name, opts in fieldsets
        ]

    def get_form(
        self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any
    ) -> Any:
        form = super().get_form(request, obj, change=change, **kwargs)
        form.may_override = bool(getattr(request.user, "is_superuser", False))  # type: ignore[attr-defined] # a fresh class per request
        return form

    def save_audited(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        verdict = getattr(form, "gate_verdict", None)
        if verdict is not None:
            rollout_override_audit(
                agent=obj,
                actor=admin_actor(request),
                before=form.initial.get("candidate_percent", 0),
                after=obj.candidate_percent,
                reason=form.cleaned_data["override_reason"],
                evaluation_id=verdict.evaluation.pk if verdict.evaluation else None,
            )
        super().save_audited(request, obj, form, change)
        agent_version_record(agent=obj, actor=admin_actor(request), source="admin")

    @admin.display(description="versions, newest first")
    def configuration_versions(self, obj: Agent) -> str:
        if not obj.pk:
            return "—"
        rows = list(
            AgentVersion.objects.filter(agent=obj).order_by("-number")[: VERSIONS_SHOWN + 1]
        )
        if not rows:
            return "none stored yet"
        items = []
        for version, before in zip(rows, [*rows[1:], None], strict=False):
            if len(items) == VERSIONS_SHOWN:
                break
            changed = (
                ", ".join(
                    sorted(
                        k
                        for k in version.config.keys() | before.config.keys()
                        if version.config.get(k) != before.config.get(k)
                    )
                )
                if before is not None
                else "first stored"
            )
            items.append(
                format_html(
                    "<details><summary>{}@{}: {} by {} ({}), {}</summary>{}</details>",
                    obj.slug,
                    version.number,
                    timezone.localtime(version.created_at).strftime("%Y-%m-%d %H:%M:%S"),
                    version.actor or "—",
                    version.source,
                    changed,
                    pre(version.config),
                )
            )
        return format_html_join("", "{}", ((item,) for item in items))

    @admin.display(description="candidate's latest evaluation")
    def candidate_evaluation(self, obj: Agent) -> str:
        if not obj.pk or obj.candidate_model_id is None:
            return "—"
        verdict = rollout_gate_judge(obj)
        evaluation = verdict.evaluation
        if evaluation is None:
            return "no finished evaluation" + (
                "" if verdict.passed else " (the gate refuses a raise)"
            )
        url = reverse("admin:evaluations_evaluation_change", args=[evaluation.pk])
        totals = evaluation.totals or {}
        return format_html(
            '<a href="{}">evaluation {}</a>: trajectory {}, cost ×{}: {}',
            url,
            evaluation.pk,
            totals.get("trajectory_match"),
            totals.get("cost_ratio"),
            "passes" if verdict.passed else verdict.message(),
        )

    def formfield_for_dbfield(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        return optional_count_field(db_field) or super().formfield_for_dbfield(
            db_field, request, **kwargs
        )

    def get_queryset(self, request: HttpRequest) -> QuerySet[Agent]:
        return super().get_queryset(request).annotate(_session_count=Count("sessions"))

    @admin.display(description="Routing, last 30 days")
    def routing_figures(self, obj: Agent) -> str:
        if not obj.pk:
            return "—"
        figures = selectors.agent_routing_figures(agent=obj, days=30)
        if not figures.turns:
            return "no turns in the last 30 days"
        return format_html(
            "{} turns: {} on the small model ({}%), {} escalated; cost {} (on the main model "
            "alone: about {}, saved about {})",
            figures.turns,
            figures.small_turns,
            round(100 * figures.small_turns / figures.turns),
            figures.escalated,
            figures.cost,
            figures.cost_main_only,
            figures.cost_main_only - figures.cost,
        )

    @admin.display(description="rollout")
    def rollout(self, obj: Agent) -> str:
        if obj.candidate_model_id and obj.candidate_percent:
            return f"{obj.candidate_percent}% → {obj.candidate_model}"
        return "—"

    @admin.display(description="tools")
    def tool_count(self, obj: Agent) -> int:
        return len(obj.tools or [])

    @admin.display(description="sessions", ordering="_session_count")
    def session_count(self, obj: Agent) -> str:
        count = getattr(obj, "_session_count", 0)
        url = reverse("admin:agent_sessions_session_changelist") + f"?agent__id__exact={obj.pk}"
        return format_html('<a href="{}">{}</a>', url, count)
