"""The session list and a session's page: its summary, timeline (approvals inline), and the
operator's controls: cancel, resume, force-finish, fork, and human takeover.

Each control takes its own permission, checked in the action and in the POST handler alike:
cancel and resume "operate" (Django's change session permission: a session is never edited
otherwise); fork `fork_session`; reply, force-finish and hand back `take_over_session`; a tool
run by hand `run_tool_session`. What was said takes `view_message_content`."""

import json
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.contrib import admin, messages
from django.contrib.postgres.aggregates import StringAgg
from django.core.exceptions import PermissionDenied
from django.db.models import Count, OuterRef, QuerySet, Sum
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
)
from django.shortcuts import get_object_or_404
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html

from accounts.admin_access import (
    MESSAGE_CONTENT,
    ContentMaskedAdmin,
    OwnerFilter,
    holds,
    masked,
)
from accounts.tenancy import TenantScopedAdmin, tenant_scope
from evaluations.models import Evaluation
from hooks.models import ScheduleFire, WebhookDelivery
from observability.tracing import trace_id_of
from record.errors import Conflict, DomainError, InvalidInput
from record.models import Session, TurnOutcomeChoice
from record.states import TURN_ENDED, State
from tools.execution import tools_for_agent

from .. import selectors, services
from ..status import STATES, outcome_status
from .base import SessionIdSearch
from .display import (
    calls_line,
    format_cost,
    outcome_badge,
    pre,
    short,
    state_badge,
    turn_outcome_badge,
)
from .previews import fork_preview_page, tool_run_preview_page
from .timeline import KINDS, TIMELINE_LIMIT, group_by_node, session_timeline, trace_url
from .workflow_run import workflow_run_view

FIRST_MESSAGE_CHARS = 60


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True


class LastTurnOutcomeFilter(admin.SimpleListFilter):
    """How the last ended turn went (DESIGN.md "A turn's outcome"); "not ok" is any of
    the three others."""

    title = "last turn"
    parameter_name = "last_turn"
    NOT_OK = "not_ok"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [
            (self.NOT_OK, "not ok (failures, stops, errors)"),
            *((choice.value, outcome_status(choice.value).label) for choice in TurnOutcomeChoice),
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Session]) -> QuerySet[Session]:
        value = self.value()
        if value == self.NOT_OK:
            return queryset.exclude(last_turn_outcome__in=[TurnOutcomeChoice.OK, ""])
        if value in TurnOutcomeChoice.values:
            return queryset.filter(last_turn_outcome=value)
        return queryset


class StateFilter(admin.SimpleListFilter):
    """The session's state, in the words its badge uses (sessions/status.py)."""

    title = "state"
    parameter_name = "state__exact"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(state, status.label) for state, status in STATES.items()]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Session]) -> QuerySet[Session]:
        value = self.value()
        return queryset.filter(state=value) if value in STATES else queryset


@dataclass
class SessionSummary:
    """What an operator reads first on a session's page."""

    session: Session
    stop_reason: str | None
    stop_turn: int | None
    finished_at: datetime | None
    model_calls: int
    model_failures: int
    models: str
    tool_calls: int
    tool_counts: dict[str, int]

    @property
    def state_badge(self) -> str:
        return state_badge(self.session.state, self.session.last_turn_outcome)

    @property
    def outcome(self) -> str:
        return outcome_badge(self.stop_reason)

    @property
    def last_turn(self) -> str:
        """The last ended turn's outcome badge (ok, tool failures, stopped, error)."""
        session = self.session
        if not session.last_turn_outcome:
            return ""
        return turn_outcome_badge(session.last_turn_outcome)

    @property
    def stop_label(self) -> str:
        """The last ended turn's stop reason in words (model unavailable, max iterations)."""
        return (self.stop_reason or "").replace("_", " ")

    @property
    def last_turn_calls(self) -> str:
        return calls_line(self.session.last_turn_calls)

    @property
    def tool_calls_line(self) -> str:
        """Every call of the session by status, in the words the last turn's line uses."""
        return calls_line(self.tool_counts)

    @property
    def model_calls_url(self) -> str:
        """The model call list of this session (each call's tokens, time, cost and outcome)."""
        return f"{reverse('admin:agent_sessions_modelcall_changelist')}?session={self.session.pk}"

    @property
    def cost(self) -> str:
        return format_cost(self.session.cost)

    @property
    def trace_id(self) -> str:
        """The current (or last) turn's trace, when traces were on for it."""
        return trace_id_of(self.session.trace_parent)

    @property
    def trace_url(self) -> str:
        return trace_url(self.trace_id)

    @property
    def running(self) -> bool:
        return self.session.state not in TURN_ENDED and self.session.state != State.IDLE

    # The dialogue line quotes what the user said (its slots): shown only with the content
    # permission (the view sets it).
    content: bool = True

    @property
    def dialogue(self) -> str:
        """The dialogue state in one line: intent and slots, each with the turn that set it."""
        return dialogue_line(self.session.dialogue_state) if self.content else ""


def dialogue_line(state: Any) -> str:
    if not isinstance(state, dict) or not (state.get("intent") or state.get("slots")):
        return ""
    parts = []
    if state.get("intent"):
        parts.append(f"intent {state['intent']} (turn {state.get('intent_turn', '?')})")
    turns = state.get("slot_turns") or {}
    parts += [
        f"{name} = {json.dumps(value, ensure_ascii=False)} (turn {turns.get(name, '?')})"
        for name, value in sorted((state.get("slots") or {}).items())
    ]
    return "; ".join(parts)


def session_related(session: Session, user: Any) -> list[tuple[str, str, str]]:
    """What else names this session, as (what, link, text): the evaluations that replayed
    it (those the user may see) or the one it is a replay of, the schedule fire that
    started it, its run webhooks' deliveries. Each one's own page links back here. Only
    the kinds the user may view are listed: no link leads to a 403."""
    found: list[tuple[str, str, str]] = []
    evaluations = tenant_scope(Evaluation.objects.filter(sessions=session), user, "owner")
    if not user.has_perm("evaluations.view_evaluation"):
        evaluations = evaluations.none()
    elif session.evaluation_id:
        evaluations = evaluations | tenant_scope(
            Evaluation.objects.filter(pk=session.evaluation_id), user, "owner"
        )
    for evaluation in evaluations.distinct().order_by("-pk")[:20]:
        what = "replay of" if evaluation.pk == session.evaluation_id else "replayed by"
        found.append(
            (
                "evaluation",
                reverse("admin:evaluations_evaluation_change", args=[evaluation.pk]),
                f"{what} evaluation {evaluation.pk} ({evaluation.state})",
            )
        )
    fires = ScheduleFire.objects.filter(session=session).select_related("schedule")
    if not user.has_perm("hooks.view_schedule"):
        fires = fires.none()
    for fire in fires[:5]:
        found.append(
            (
                "schedule",
                reverse("admin:hooks_schedule_change", args=[fire.schedule_id]),
                f"started by schedule {fire.schedule.name}, due {fire.due:%Y-%m-%d %H:%M}",
            )
        )
    deliveries = WebhookDelivery.objects.filter(session=session).order_by("turn")
    if not user.has_perm("hooks.view_webhookdelivery"):
        deliveries = deliveries.none()
    for delivery in deliveries[:20]:
        found.append(
            (
                "webhook",
                reverse("admin:hooks_webhookdelivery_change", args=[delivery.pk]),
                f"turn {delivery.turn} webhook: {delivery.status}, {delivery.attempts} attempt(s)",
            )
        )
    return found


def session_summary(session: Session) -> SessionSummary:
    activity = selectors.session_activity(session=session)
    return SessionSummary(
        session=session,
        stop_reason=activity.stop_reason,
        stop_turn=activity.stop_turn,
        finished_at=activity.finished_at,
        model_calls=activity.model_calls,
        model_failures=activity.model_failures,
        models=activity.models,
        tool_calls=activity.tool_calls,
        tool_counts=activity.tool_counts,
    )


def _json_or_invalid(raw: str) -> Any:
    try:
        return json.loads(raw or "{}")
    except ValueError as exc:
        raise InvalidInput(f"the arguments are not valid JSON: {exc}") from None


def takeover_context(session: Session, allowed: set[str]) -> dict[str, Any]:
    """Which of the operator's controls apply to the session as it is now, among the
    ones the operator holds the permission for (`allowed`: operate, take_over, run_tool, fork)."""
    state = State(session.state)
    ended = state in TURN_ENDED
    # A workflow run is no conversation: nobody to reply to or hand back to.
    conversation = session.workflow_version_id is None
    controls = {
        "force_finish": conversation and state in services.WAITING and "take_over" in allowed,
        "resume": state == State.ERROR and "operate" in allowed,
        "takeover": conversation and ended and "take_over" in allowed,
        "run_tool": conversation and ended and "run_tool" in allowed,
        "fork": session.step > 0 and "fork" in allowed,
    }
    tools = (
        tools_for_agent(list(session.agent.tools), role=session.role)
        if controls["run_tool"]
        else {}
    )
    return {
        **controls,
        "any": any(controls.values()),
        "running": not ended,
        "tools": [
            (name, json.dumps(_example(t.parameters)), t.side_effects)
            for name, t in sorted(tools.items())
        ],
    }


def _example(schema: dict[str, Any]) -> dict[str, Any]:
    """A skeleton of the required arguments, for the operator to fill in."""
    props = schema.get("properties") or {}
    blank = {"string": "", "integer": 0, "number": 0, "boolean": False, "array": [], "object": {}}
    return {
        name: blank.get(str((props.get(name) or {}).get("type")))
        for name in schema.get("required") or []
    }


def _step_or_invalid(raw: str) -> int:
    if not raw.isdigit():
        raise InvalidInput(f"checkpoint step must be a number, not {raw[:20]!r}")
    return int(raw)


# Each control of the session page, and the permission it takes (a has_<name>_permission).
# Fork and run_tool first show a preview; only a POST with confirm=yes acts.
CONTROLS = {
    "resume": "operate",
    "force_finish": "take_over",
    "reply": "take_over",
    "hand_back": "take_over",
    "run_tool": "run_tool",
    "fork": "fork",
}


@admin.register(Session)
class SessionAdmin(ContentMaskedAdmin, TenantScopedAdmin, SessionIdSearch):
    change_form_template = "admin/agent_sessions/session/change_form.html"
    list_display = (
        "short_id",
        "state_display",
        "outcome",
        "cost_display",
        "degraded",
        "tokens",
        "turns",
        "agent",
        "owner",
        "role",
        "models_used",
        "updated",
    )
    list_filter = (
        StateFilter,
        LastTurnOutcomeFilter,
        "degradation_level",
        "agent",
        # Names owners only to who may view users (auth.view_user).
        ("owner", OwnerFilter),
        "role",
        "model_calls__endpoint_name",
    )
    # A full id is an exact lookup; a part of one (the short id shown) a text match; with
    # the content permission, words also find the sessions whose messages say them
    # (PostgreSQL full-text search, `get_search_results`).
    session_lookup = "pk"
    search_fields = ("id", "owner__username", "agent__slug")
    search_help_text = (
        "A session id (or its first characters), an owner, an agent, or words said in the "
        'session\'s messages (e.g. coupon, "Ada Lovelace", SO-1001).'
    )
    date_hierarchy = "created_at"
    list_select_related = ("agent", "owner")
    ordering = ("-created_at",)
    actions = ("cancel_running_turn", "resume_failed_run")
    content_permission = MESSAGE_CONTENT
    content_fields = {"dialogue_pretty": "dialogue_hidden"}
    dialogue_hidden = masked("dialogue state", MESSAGE_CONTENT)
    readonly_fields = (
        "id",
        "agent",
        "agent_version_shown",
        "owner",
        "role",
        "state_display",
        "cancel_requested",
        "last_error",
        "turn",
        "step",
        "iteration",
        "queued_count",
        "input_tokens",
        "output_tokens",
        "cost",
        "degradation_level",
        "version",
        "lease_owner",
        "lease_expires_at",
        "message_seq",
        "event_seq",
        "created_at",
        "updated_at",
        "checkpoint_stats",
        "cancel_reason",
        "cancel_actor",
        "timer_due_at",
        "timer_note",
        "forked_from",
        "forked_at_step",
        "metadata_pretty",
        "dialogue_pretty",
    )
    # The summary and the timeline lead the page (see the template); these are
    # the raw columns, for when an operator needs one.
    fieldsets = (
        (
            "Session",
            {
                "fields": (
                    "id",
                    "agent",
                    "agent_version_shown",
                    "owner",
                    "role",
                    "state_display",
                    "cancel_requested",
                    "last_error",
                ),
                "classes": ("collapse",),
            },
        ),
        (
            "Usage",
            {
                "fields": (
                    "turn",
                    "step",
                    "iteration",
                    "queued_count",
                    "input_tokens",
                    "output_tokens",
                    "cost",
                    "degradation_level",
                ),
                "classes": ("collapse",),
            },
        ),
        (
            "Engine bookkeeping",
            {
                "fields": (
                    "version",
                    "lease_owner",
                    "lease_expires_at",
                    "message_seq",
                    "event_seq",
                    "created_at",
                    "updated_at",
                ),
                "classes": ("collapse",),
            },
        ),
        (
            "Durability",
            {
                "fields": (
                    "checkpoint_stats",
                    "cancel_reason",
                    "cancel_actor",
                    "timer_due_at",
                    "timer_note",
                    "forked_from",
                    "forked_at_step",
                ),
                "classes": ("collapse",),
            },
        ),
        ("Metadata", {"fields": ("metadata_pretty",), "classes": ("collapse",)}),
        ("Dialogue state", {"fields": ("dialogue_pretty",), "classes": ("collapse",)}),
    )

    @admin.display(description="session", ordering="id")
    def short_id(self, obj: Session) -> str:
        """The id, and under it the first thing the user said (its first words, wrapped
        within the id's width: a column of its own did not fit a 1400 px screen). Read only
        with the content permission (`get_queryset`)."""
        said = short(getattr(obj, "_first_message", None), FIRST_MESSAGE_CHARS)
        return format_html(
            '<code title="{}">{}</code>{}',
            obj.pk,
            str(obj.pk)[:8],
            format_html(
                '<span class="ap-first-message" style="display:block;max-width:22ch;'
                'white-space:normal;font-size:11px;color:var(--body-quiet-color)">{}</span>',
                said,
            )
            if said
            else "",
        )

    @admin.display(description="state", ordering="state")
    def state_display(self, obj: Session) -> str:
        return state_badge(obj.state, obj.last_turn_outcome)

    @admin.display(description="turns", ordering="turn")
    def turns(self, obj: Session) -> int:
        return obj.turn

    @admin.display(description="tokens in / out", ordering="input_tokens")
    def tokens(self, obj: Session) -> str:
        return f"{obj.input_tokens} / {obj.output_tokens}"

    @admin.display(description="updated", ordering="updated_at")
    def updated(self, obj: Session) -> str:
        return timezone.localtime(obj.updated_at).strftime("%Y-%m-%d %H:%M:%S")

    @admin.display(description="degraded", ordering="degradation_level")
    def degraded(self, obj: Session) -> str:
        # Level 0 is the normal case: only a degraded session draws the eye.
        return f"level {obj.degradation_level}" if obj.degradation_level else "–"

    @admin.display(description="cost", ordering="cost")
    def cost_display(self, obj: Session) -> str:
        return format_cost(obj.cost)

    @admin.display(description="last turn", ordering="last_turn_outcome")
    def outcome(self, obj: Session) -> str:
        stop_reason = getattr(obj, "_stop_reason", None)
        if not obj.last_turn_outcome:
            # A turn that ended before outcomes were recorded: its stop reason only.
            return outcome_badge(stop_reason, obj.last_error)
        return turn_outcome_badge(obj.last_turn_outcome, obj.last_turn_calls, stop_reason)

    @admin.display(description="metadata")
    def metadata_pretty(self, obj: Session) -> str:
        return pre(obj.metadata)

    @admin.display(description="dialogue state")
    def dialogue_pretty(self, obj: Session) -> str:
        return pre(obj.dialogue_state)

    @admin.display(description="agent version")
    def agent_version_shown(self, obj: Session) -> str:
        """The configuration version its current or last turn ran on ("support@5")."""
        version = obj.agent_version
        return "—" if version is None else f"{version.agent.slug}@{version.number}"

    def get_queryset(self, request: HttpRequest) -> QuerySet[Session]:
        # One aggregate and indexed subqueries for the list instead of queries per row.
        queryset = (
            super()
            .get_queryset(request)
            .annotate(
                _models=StringAgg(
                    "model_calls__endpoint_name", delimiter=", ", distinct=True, default=""
                ),
                _stop_reason=selectors.last_stop_reason(OuterRef("pk")),
            )
        )
        if self.shows_content(request):
            queryset = queryset.annotate(
                _first_message=selectors.first_message(OuterRef("pk"), FIRST_MESSAGE_CHARS + 1)
            )
        return queryset

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Session], search_term: str
    ) -> tuple[QuerySet[Session], bool]:
        found, duplicates = super().get_search_results(request, queryset, search_term)
        term = search_term.strip()
        if not term or _is_uuid(term) or not self.shows_content(request):
            # No term, a full session id (an exact lookup), or no right to search what was
            # said (finding a session would tell what its messages say).
            return found, duplicates
        return found | queryset.filter(pk__in=selectors.sessions_saying(text=term)), duplicates

    @admin.display(description="models used")
    def models_used(self, obj: Session) -> str:
        return getattr(obj, "_models", "") or "—"

    def has_add_permission(self, request: HttpRequest) -> bool:
        # Sessions are opened through the API, by the key that owns them.
        return False

    # A session is a record of what the engine did: nobody edits or deletes it
    # here. Its state moves only through the services (cancel, resume), which
    # need the "change session" permission (`has_operate_permission`).
    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_operate_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        opts = self.opts
        return request.user.has_perm(f"{opts.app_label}.change_{opts.model_name}")

    def has_fork_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return holds(request, "agent_sessions.fork_session")

    def has_take_over_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return holds(request, "agent_sessions.take_over_session")

    def has_run_tool_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return holds(request, "agent_sessions.run_tool_session")

    def allowed_controls(self, request: HttpRequest) -> set[str]:
        """The names of the permissions in CONTROLS this user holds."""
        return {
            name
            for name in set(CONTROLS.values())
            if getattr(self, f"has_{name}_permission")(request)
        }

    @admin.action(description="Cancel the running turn", permissions=["operate"])
    def cancel_running_turn(self, request: HttpRequest, queryset: QuerySet[Session]) -> None:
        cancelled, idle = self._cancel(request, list(queryset))
        if cancelled:
            self.message_user(
                request, f"Cancel requested for {cancelled} session(s).", messages.SUCCESS
            )
        if idle:
            self.message_user(
                request, f"{idle} session(s) had no running turn to cancel.", messages.WARNING
            )

    @admin.action(description="Resume a run that stopped in error", permissions=["operate"])
    def resume_failed_run(self, request: HttpRequest, queryset: QuerySet[Session]) -> None:
        actor = f"admin:{request.user.get_username()}"
        resumed, refused = 0, []
        for session in queryset:
            try:
                services.session_resume(session=session, actor=actor)
                resumed += 1
            except Conflict as exc:
                refused.append(f"{str(session.pk)[:8]}: {exc.message}")
        if resumed:
            self.message_user(request, f"Resumed {resumed} session(s).", messages.SUCCESS)
        for line in refused:
            self.message_user(request, line, messages.WARNING)

    @admin.display(description="checkpoints")
    def checkpoint_stats(self, obj: Session) -> str:
        stats = obj.checkpoints.aggregate(count=Count("id"), size=Sum("size_bytes"))
        url = reverse("admin:agent_sessions_checkpoint_changelist") + f"?q={obj.pk}"
        return format_html(
            '<a href="{}">{} checkpoints, {} bytes</a>', url, stats["count"], stats["size"] or 0
        )

    def _cancel(self, request: HttpRequest, sessions: list[Session]) -> tuple[int, int]:
        actor = f"admin:{request.user.get_username()}"
        done = 0
        for session in sessions:
            if services.session_cancel(
                session=session, reason="cancelled by operator", actor=actor
            ):
                done += 1
        return done, len(sessions) - done

    def get_urls(self) -> list[Any]:
        urls = [
            path(
                "<path:object_id>/cancel/",
                self.admin_site.admin_view(self.cancel_view),
                name="agent_sessions_session_cancel",
            ),
            path(
                "<path:object_id>/operate/",
                self.admin_site.admin_view(self.operate_view),
                name="agent_sessions_session_operate",
            ),
        ]
        return urls + super().get_urls()

    def operate_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """The session page's controls: resume, force-finish, fork, and human takeover."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        try:
            session_id = uuid.UUID(object_id)
        except ValueError:
            raise Http404("no such session") from None
        session = get_object_or_404(
            tenant_scope(Session.objects.select_related("agent"), request.user, "owner"),
            pk=session_id,
        )
        # "fork@<step>": a fork from that checkpoint (a workflow node's, on the run's graph).
        action, _, at = request.POST.get("action", "").partition("@")
        allowed = self.allowed_controls(request)
        # An unknown action is told as such only to someone who holds some control.
        if not allowed or (action in CONTROLS and CONTROLS[action] not in allowed):
            raise PermissionDenied
        actor = f"admin:{request.user.get_username()}"
        content = request.POST.get("content", "")
        target = session
        try:
            if action == "resume":
                services.session_resume(session=session, actor=actor)
                done = "Resumed: the run goes on from where it stopped."
            elif action == "force_finish":
                services.session_force_finish(session=session, content=content, actor=actor)
                done = "The turn ended with your answer."
            elif action == "reply":
                services.session_operator_reply(session=session, content=content, actor=actor)
                done = "Your reply was recorded as from the operator."
            elif action == "run_tool":
                tool = request.POST.get("tool", "")
                arguments = _json_or_invalid(request.POST.get("arguments", ""))
                if request.POST.get("confirm") != "yes":  # a preview first
                    return tool_run_preview_page(self, request, session, tool, arguments)
                call = services.session_operator_tool_run(
                    session=session, tool_name=tool, arguments=arguments, actor=actor
                )
                done = f"{call.tool_name} runs by hand on a worker (call {call.call_id}); see the timeline."
            elif action == "hand_back":
                services.session_hand_back(session=session, actor=actor)
                done = "Handed back: the agent decides next."
            elif action == "fork":
                step = _step_or_invalid(at) if at else session.step
                if request.POST.get("confirm") != "yes":  # a preview first
                    return fork_preview_page(self, request, session, step)
                target = services.session_fork(session=session, step=step, actor=actor)
                done = f"Forked at step {step}: this is the new session."
            else:
                raise InvalidInput(f"unknown action {action!r}")
            self.message_user(request, done, messages.SUCCESS)
        except DomainError as exc:
            self.message_user(request, exc.message, messages.WARNING)
        return HttpResponseRedirect(
            reverse("admin:agent_sessions_session_change", args=[target.pk])
        )

    def cancel_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        try:
            session_id = uuid.UUID(object_id)
        except ValueError:  # the lookup would raise it: no such session, not a 500
            raise Http404("no such session") from None
        session = get_object_or_404(
            tenant_scope(Session.objects.all(), request.user, "owner"), pk=session_id
        )
        if not self.has_operate_permission(request, session):
            raise PermissionDenied
        cancelled, _ = self._cancel(request, [session])
        if cancelled:
            self.message_user(
                request, "Cancel requested; the run stops at its next step.", messages.SUCCESS
            )
        else:
            self.message_user(
                request, "This session has no running turn to cancel.", messages.WARNING
            )
        return HttpResponseRedirect(
            reverse("admin:agent_sessions_session_change", args=[session.pk])
        )

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        extra_context = dict(extra_context or {})
        try:
            session_id = uuid.UUID(str(object_id))
        except ValueError:  # not a UUID: the admin itself says the object does not exist
            return super().change_view(request, object_id, form_url, extra_context=extra_context)
        visible = tenant_scope(Session.objects.all(), request.user, "owner")
        if not visible.filter(pk=session_id).exists():
            # Another tenant's (or no) session: the admin says it does not exist, and
            # nothing of its timeline is read.
            return super().change_view(request, object_id, form_url, extra_context=extra_context)
        content = self.shows_content(request)
        items, truncated = session_timeline(session_id, content=content)
        session = Session.objects.select_related("agent", "owner").filter(pk=session_id).first()
        if session is not None:
            summary = session_summary(session)
            summary.content = content
            extra_context["summary"] = summary
        extra_context.update(
            can_operate=self.has_operate_permission(request),
            timeline=items,
            timeline_truncated=truncated,
            timeline_limit=TIMELINE_LIMIT,
            timeline_kinds=[(kind, label) for kind, (label, _) in KINDS.items()],
            history_links=[
                (
                    label,
                    reverse(f"admin:agent_sessions_{kind}_changelist") + f"?session={session_id}",
                )
                for kind, (label, _) in KINDS.items()
            ],
            cancellable_states=[s.value for s in State if s not in TURN_ENDED],
        )
        extra_context["history_links"].append(
            (
                "Model call",
                reverse("admin:agent_sessions_modelcall_changelist") + f"?session={session_id}",
            )
        )
        if session is not None:
            extra_context["takeover"] = takeover_context(session, self.allowed_controls(request))
            extra_context["timeline_kinds"].append(("approval", "Approval"))
            if session.workflow_version_id is not None:
                extra_context["workflow_run"] = workflow_run_view(session, content=content)
                # A run's timeline reads node by node, each group collapsible.
                extra_context["timeline_groups"] = group_by_node(items)
            extra_context["related"] = session_related(session, request.user)
            # The tree: who started this session, and the sessions its agent calls started.
            extra_context["children"] = list(
                Session.objects.filter(parent=session)
                .order_by("created_at")
                .values("pk", "agent__slug", "state", "parent_call__call_id")
            )
        return super().change_view(request, object_id, form_url, extra_context=extra_context)
