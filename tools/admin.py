"""Tools as data: operators edit what the model sees and who may call it."""

from typing import Any

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.db import models
from django.db.models import Count, QuerySet
from django.http import HttpRequest
from django.utils.text import Truncator
from django.utils.timezone import localtime
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from accounts.admin_access import holds
from audit.edits import AuditedAdmin, admin_actor, breaker_reset_audit

from .descriptions import description_problems
from .estimates import estimate_problems
from .execution import tool_breaker
from .forms import JSON_FIELD, breaker_badge, optional_count_field
from .models import TOOL_SETTINGS, McpServer, RefreshState, Tool, ToolKind
from .registry import HANDLERS
from .services import RefreshNotQueued, mcp_server_refresh_queue
from .stdio_policy import command_problem, env_problems

HTTP_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")


def _schema_path(error: SchemaError) -> str:
    return "".join(f"[{part!r}]" if isinstance(part, str) else f"[{part}]" for part in error.path)


class ToolAdminForm(forms.ModelForm):
    url = forms.URLField(
        max_length=500,
        required=False,
        assume_scheme="https",
        help_text="HTTP tools: the business API.",
    )

    class Meta:
        model = Tool
        fields = ("name", *TOOL_SETTINGS)
        widgets = {
            "description": forms.Textarea(attrs={"rows": 4, "cols": 100}),
            "result_description": forms.Textarea(attrs={"rows": 2, "cols": 100}),
        }

    def clean_parameters(self) -> Any:
        schema = self.cleaned_data.get("parameters")
        if not isinstance(schema, dict):
            raise forms.ValidationError(
                'Enter a JSON Schema object, for example {"type": "object", "properties": {}}.'
            )
        try:
            Draft202012Validator.check_schema(schema)
        except SchemaError as exc:
            where = _schema_path(exc)
            raise forms.ValidationError(
                f"Not a valid JSON Schema (Draft 2020-12){' at ' + where if where else ''}: {exc.message}"
            ) from None
        if schema.get("type") != "object":
            raise forms.ValidationError(
                'The top level must be {"type": "object"}: tool arguments are a JSON object.'
            )
        return schema

    def clean_headers(self) -> Any:
        headers = self.cleaned_data.get("headers")
        if headers in (None, ""):
            return {}

        def secret_ref(value: Any) -> bool:
            # {"env": "NAME"}: the secret is read from the environment when the tool is called.
            return (
                isinstance(value, dict)
                and set(value) == {"env"}
                and isinstance(value["env"], str)
                and bool(value["env"])
            )

        if not isinstance(headers, dict) or not all(
            isinstance(v, str) or secret_ref(v) for v in headers.values()
        ):
            raise forms.ValidationError(
                'Enter a JSON object of header names to string values, e.g. {"X-Team": "support"}, '
                'or to {"env": "NAME"} for a secret read from an environment variable.'
            )
        return headers

    def clean_value(self) -> str:
        return self._estimate("value")

    def clean_cost(self) -> str:
        return self._estimate("cost")

    def _estimate(self, field: str) -> str:
        source: str = (self.cleaned_data.get(field) or "").strip()
        problems = estimate_problems(source) if source else []
        if problems:
            raise forms.ValidationError(problems[0])
        return source

    def clean_risk_level(self) -> int | None:
        level: int | None = self.cleaned_data["risk_level"]
        if level is not None and level > 3:
            raise forms.ValidationError("Risk level goes from 0 (harmless) to 3 (highest).")
        return level

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        kind = data.get("kind")
        if kind == ToolKind.PYTHON:
            handler = data.get("handler") or ""
            if not handler:
                self.add_error("handler", "A Python tool needs the name of a registered handler.")
            elif handler not in HANDLERS:
                known = ", ".join(sorted(HANDLERS)) or "none"
                self.add_error(
                    "handler", f"No registered handler '{handler}' (registered: {known})."
                )
        elif kind == ToolKind.HTTP:
            if not data.get("url"):
                self.add_error("url", "An HTTP tool needs the URL of its business API.")
            method = (data.get("method") or "").upper()
            if method not in HTTP_METHODS:
                self.add_error("method", f"Use one of {', '.join(HTTP_METHODS)}.")
            else:
                data["method"] = method
        problems = description_problems(
            description=data.get("description") or "",
            parameters=data.get("parameters") or {},
            result_description=data.get("result_description") or "",
        )
        # Strict mode refuses a description that does not help the model (MCP tools only warn).
        if problems and settings.TOOL_DESCRIPTIONS_STRICT and kind != ToolKind.MCP:
            self.add_error(
                "description", [f"{p} (TOOL_DESCRIPTIONS_STRICT is on)" for p in problems]
            )
        return data


@admin.register(Tool)
class ToolAdmin(AuditedAdmin, admin.ModelAdmin):
    form = ToolAdminForm
    formfield_overrides = {models.URLField: {"assume_scheme": "https"}, **JSON_FIELD}
    list_display = (
        "name",
        "enabled",
        "breaker",
        "kind",
        "side_effects",
        "approval",
        "risk_level",
        "roles_display",
        "credit_cost",
        "description_short",
    )
    list_editable = ("enabled",)
    list_filter = ("kind", "enabled", "side_effects", "requires_approval", "risk_level")
    search_fields = ("name", "description", "handler", "url")
    readonly_fields = ("updated_at", "description_check", "mcp_source")
    actions = ("reset_breaker",)
    fieldsets = (
        (
            None,
            {
                "fields": (
                    "name",
                    "enabled",
                    "description",
                    "result_description",
                    "description_check",
                )
            },
        ),
        (
            "Arguments",
            {
                "fields": ("parameters",),
                "description": "JSON Schema (Draft 2020-12) with a top-level object type.",
            },
        ),
        (
            "How it runs",
            {
                "fields": (
                    "kind",
                    "handler",
                    "url",
                    "method",
                    "headers",
                    "timeout_s",
                    "retry",
                    "mcp_source",
                )
            },
        ),
        (
            "After a crash",
            {
                "fields": ("idempotent", "status_url", "probe_handler"),
                "description": "How an uncertain side-effecting call is checked before it is sent again.",
            },
        ),
        (
            "Before a resumed or forked run continues",
            {
                "fields": ("precheck_url", "precheck_handler"),
                "description": "A check that the preconditions of the last call's arguments still hold "
                "(e.g. the order still exists and is unpaid); a failed check is told to the model.",
            },
        ),
        (
            "Safety and cost",
            {"fields": ("side_effects", "requires_approval", "risk_level", "roles", "credit_cost")},
        ),
        (
            "Credit pool request",
            {
                "fields": ("value", "cost"),
                "description": "CEL over the call's args and the session: its estimated value "
                "(empty: the session's) and cost in points (empty: credit_cost). A credit pool "
                "grants waiting calls highest value / cost first.",
            },
        ),
        (
            "Degradation and rate limits",
            {
                "fields": (
                    "critical",
                    "rate_limit_calls_per_min",
                    "rate_limit_tokens_per_min",
                    "sla_rate",
                    "quota",
                ),
                "description": "Critical tools still run at degradation level 3. Limits are per "
                "owner per minute, shared by all workers; 0 = no limit. The service's declared "
                "sla_rate and quota are shown to the model with its recent success rate and "
                "what is left of the quota.",
            },
        ),
        (
            "Approval",
            {
                "fields": (
                    "approval_when",
                    "approval_timeout_s",
                    "approval_on_timeout",
                    "approval_escalate_to",
                ),
                "description": "When a person must approve a call (requires_approval and risk level 3 "
                "always do), how long they have, and what the deadline does.",
            },
        ),
        (None, {"fields": ("updated_at",)}),
    )

    def formfield_for_dbfield(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        return optional_count_field(db_field) or super().formfield_for_dbfield(
            db_field, request, **kwargs
        )

    def has_reset_breaker_permission(self, request: HttpRequest) -> bool:
        # A reset sends calls to a tool the breaker judged down: not an edit of the row.
        return holds(request, "tools.reset_breaker_tool")

    @admin.action(description="Reset the circuit breaker", permissions=["reset_breaker"])
    def reset_breaker(self, request: HttpRequest, queryset: QuerySet[Tool]) -> None:
        breaker = tool_breaker()
        for tool in queryset:
            state = breaker.state(tool.name).state
            breaker.reset(tool.name)
            breaker_reset_audit(request, tool, state)
        self.message_user(request, f"Reset {queryset.count()} breaker(s).")

    @admin.display(description="approval", boolean=True, ordering="requires_approval")
    def approval(self, obj: Tool) -> bool:
        return obj.requires_approval

    @admin.display(description="roles")
    def roles_display(self, obj: Tool) -> str:
        return ", ".join(obj.roles) or "— (every role)"

    @admin.display(description="breaker")
    def breaker(self, obj: Tool) -> str:
        state = tool_breaker().state(obj.name)
        return breaker_badge(state.state, state.failures)

    @admin.display(description="description")
    def description_short(self, obj: Tool) -> str:
        return Truncator(" ".join(obj.description.split())).chars(70)

    @admin.display(description="description check")
    def description_check(self, obj: Tool) -> str:
        problems = description_problems(
            description=obj.description,
            parameters=obj.parameters,
            result_description=obj.result_description,
        )
        return "; ".join(problems) if problems else "helps the model: nothing missing"

    @admin.display(description="MCP server")
    def mcp_source(self, obj: Tool) -> str:
        if obj.mcp_server_id is None:
            return "—"
        return f"{obj.mcp_server} (tool {obj.mcp_tool}); refresh the server to update it"

    def save_model(self, request: HttpRequest, obj: Tool, form: Any, change: bool) -> None:
        super().save_model(request, obj, form, change)
        problems = description_problems(
            description=obj.description,
            parameters=obj.parameters,
            result_description=obj.result_description,
        )
        for problem in problems:
            messages.warning(request, f"tool {obj.name}: {problem}")


class McpServerAdminForm(forms.ModelForm):
    """The command and env are fields of a superuser's form only (read-only for the rest)."""

    url = forms.URLField(
        max_length=500,
        required=False,
        assume_scheme="https",
        help_text="Streamable HTTP endpoint.",
    )

    class Meta:
        model = McpServer
        fields = (
            "name",
            "enabled",
            "url",
            "headers",
            "command",
            "env",
            "timeout_s",
            "roles",
            "tool_roles",
        )

    def clean_command(self) -> Any:
        command = self.cleaned_data.get("command") or []
        if command and (problem := command_problem(command)):
            raise forms.ValidationError(problem)
        return command

    def clean_env(self) -> Any:
        env = self.cleaned_data.get("env")
        if env in (None, ""):
            return {}
        if problems := env_problems(env):
            raise forms.ValidationError(problems)
        return env

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if "env" in self.fields and data.get("env") and data.get("url"):
            self.add_error("env", "only for stdio servers (a command); a url server has headers")
        return data


@admin.register(McpServer)
class McpServerAdmin(AuditedAdmin, admin.ModelAdmin):
    form = McpServerAdminForm
    formfield_overrides = {models.URLField: {"assume_scheme": "https"}, **JSON_FIELD}  # type: ignore[dict-item]
    list_display = ("name", "enabled", "transport", "tool_count", "last_refresh")
    list_filter = ("enabled", "refresh_state")
    search_fields = ("name", "url")
    readonly_fields = ("refresh_state", "refresh_queued_at", "refreshed_at", "last_error")
    actions = ("refresh_tools",)

    def get_queryset(self, request: HttpRequest) -> QuerySet[McpServer]:
        return super().get_queryset(request).annotate(tool_total=Count("tools"))

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        fields = list(super().get_readonly_fields(request, obj))
        # What runs on the host is the deployer's: apply_config or a superuser sets it.
        if not request.user.is_superuser:
            fields += [*STDIO_FIELDS]
        return fields

    @admin.display(description="transport")
    def transport(self, obj: McpServer) -> str:
        text = obj.url or "stdio: " + " ".join(obj.command)
        return Truncator(text).chars(60)

    @admin.display(description="tools", ordering="tool_total")
    def tool_count(self, obj: McpServer) -> int:
        return int(getattr(obj, "tool_total", 0))

    @admin.display(description="last refresh", ordering="refreshed_at")
    def last_refresh(self, obj: McpServer) -> str:
        if obj.refresh_state == RefreshState.QUEUED:
            return f"queued {_when(obj.refresh_queued_at)}"
        if not obj.refresh_state:
            return "—"
        outcome = f"{obj.refresh_state} {_when(obj.refreshed_at)}"
        return f"{outcome}: {Truncator(obj.last_error).chars(60)}" if obj.last_error else outcome

    def has_refresh_permission(self, request: HttpRequest) -> bool:
        # A refresh adds, changes and disables Tool rows from what the server lists now.
        return holds(request, "tools.refresh_mcpserver")

    @admin.action(
        description="Refresh tools (a worker lists them; the row shows the outcome)",
        permissions=["refresh"],
    )
    def refresh_tools(self, request: HttpRequest, queryset: QuerySet[McpServer]) -> None:
        queued = []
        for server in queryset:
            try:
                mcp_server_refresh_queue(
                    server=server, actor=admin_actor(request), user_id=request.user.pk
                )
            except RefreshNotQueued as exc:
                messages.error(request, str(exc))
                continue
            queued.append(server.name)
        if not queued:
            return
        names = ", ".join(queued)
        messages.info(
            request,
            f"Refresh queued for {names}: a worker lists the tools; reload this page for "
            "the outcome (column 'last refresh').",
        )


STDIO_FIELDS = ("command", "env")


def _when(at: Any) -> str:
    return localtime(at).strftime("%Y-%m-%d %H:%M:%S") if at else ""
