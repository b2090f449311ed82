from django.contrib.postgres.fields import ArrayField
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models


class ToolKind(models.TextChoices):
    PYTHON = "python", "Python callable"
    HTTP = "http", "HTTP business API"
    MCP = "mcp", "MCP server tool"


class RefreshState(models.TextChoices):
    QUEUED = "queued", "queued"
    OK = "ok", "ok"
    FAILED = "failed", "failed"


class McpServer(models.Model):
    """A Model Context Protocol server whose tools are discovered and stored as Tool rows.

    Streamable HTTP (`url`) or stdio (`command`, a local process per call).
    """

    name = models.CharField(
        max_length=40, unique=True, help_text="Its tools are named <name>.<tool> in agents' lists."
    )
    url = models.URLField(max_length=500, blank=True, help_text="Streamable HTTP endpoint.")
    command = ArrayField(
        models.CharField(max_length=500),
        default=list,
        blank=True,
        help_text="Stdio: the executable (one on MCP_STDIO_COMMANDS) and its arguments. "
        "Set by apply_config or a superuser.",
    )
    env = models.JSONField(
        default=dict,
        blank=True,
        help_text='Stdio: the whole environment of the process beyond PATH and HOME, e.g. {"TZ": '
        '"UTC", "API_TOKEN": {"env": "TOOL_SECRET_X"}}. Set by apply_config or a superuser.',
    )
    headers = models.JSONField(
        default=dict,
        blank=True,
        help_text='HTTP headers; {"env": "NAME"} takes the value from an environment variable.',
    )
    timeout_s = models.FloatField(default=10.0)
    roles = ArrayField(
        models.CharField(max_length=50),
        default=list,
        blank=True,
        help_text="Who may use its tools (empty: everyone), unless tool_roles says otherwise.",
    )
    tool_roles = models.JSONField(
        default=dict,
        blank=True,
        help_text='Per-tool roles, e.g. {"wipe_orders": ["admin"]}.',
    )
    enabled = models.BooleanField(default=True)
    # The last refresh: queued by the admin, run by a worker (tools/tasks.py).
    refresh_state = models.CharField(
        max_length=10, choices=RefreshState.choices, blank=True, editable=False
    )
    refresh_queued_at = models.DateTimeField(null=True, blank=True, editable=False)
    refreshed_at = models.DateTimeField(null=True, blank=True, editable=False)
    last_error = models.TextField(
        blank=True,
        editable=False,
        help_text="The last refresh's failure: its error class and code, never the answer's text.",
    )

    class Meta:
        ordering = ["name"]
        verbose_name = "MCP server"
        # Refreshing lists the server's tools now and adds, changes or disables Tool rows.
        permissions = [("refresh_mcpserver", "Can refresh an MCP server's tools")]

    def __str__(self) -> str:
        return self.name

    def roles_for(self, tool: str) -> list[str]:
        found = (self.tool_roles or {}).get(tool)
        return list(found) if isinstance(found, list) else list(self.roles or [])

    def clean(self) -> None:
        from django.core.exceptions import ValidationError

        from .env_access import header_env_rule, refused_header_envs

        if bool(self.url) == bool(self.command):
            raise ValidationError(
                {"url": "give either a url (streamable HTTP) or a command (stdio)"}
            )
        refused = refused_header_envs(self.headers)
        if refused:
            names = ", ".join(f"{header} reads {name}" for header, name in refused)
            raise ValidationError({"headers": f"{names}, but {header_env_rule()}"})
        # The command and env are checked by the admin's form (shown to superusers only) and
        # by apply_config; a field error here would name a field a staff user's form lacks.


QUOTA_PERIODS = ("minute", "hour", "day")


def quota_problem(quota: object) -> str | None:
    """What is wrong with a tool's `quota` ({} or {"calls": 5000, "per": "day"})."""
    if quota == {}:
        return None
    if not isinstance(quota, dict) or set(quota) != {"calls", "per"}:
        return 'must be {"calls": <a whole number from 1>, "per": "minute" | "hour" | "day"}'
    calls = quota["calls"]
    if not isinstance(calls, int) or isinstance(calls, bool) or calls < 1:
        return f"calls: {str(calls)[:20]!r} is not a whole number from 1"
    if quota["per"] not in QUOTA_PERIODS:
        return f"per: {str(quota['per'])[:20]!r} is not one of minute, hour, day"
    return None


# What an operator sets on a tool, by config file (configuration/) or in the admin's form,
# in this order; `name` is its key.
TOOL_SETTINGS = (
    "description",
    "result_description",
    "kind",
    "handler",
    "url",
    "method",
    "headers",
    "parameters",
    "status_url",
    "probe_handler",
    "precheck_url",
    "precheck_handler",
    "idempotent",
    "timeout_s",
    "side_effects",
    "requires_approval",
    "risk_level",
    "approval_when",
    "approval_timeout_s",
    "approval_on_timeout",
    "approval_escalate_to",
    "roles",
    "credit_cost",
    "value",
    "cost",
    "critical",
    "rate_limit_calls_per_min",
    "rate_limit_tokens_per_min",
    "sla_rate",
    "quota",
    "retry",
    "enabled",
)


class Tool(models.Model):
    """A tool as data: what the model sees and how the executor runs it."""

    name = models.CharField(max_length=64, unique=True)
    description = models.TextField()
    parameters = models.JSONField(
        default=dict, help_text="JSON Schema (Draft 2020-12) of the arguments."
    )
    result_description = models.TextField(blank=True)
    kind = models.CharField(max_length=10, choices=ToolKind.choices, default=ToolKind.PYTHON)
    handler = models.CharField(
        max_length=200, blank=True, help_text="Registered Python callable name (python tools)."
    )
    url = models.URLField(max_length=500, blank=True)
    method = models.CharField(max_length=10, default="POST", blank=True)
    headers = models.JSONField(
        default=dict,
        blank=True,
        help_text='Extra headers; {"env": "NAME"} takes the value from an environment variable.',
    )
    status_url = models.URLField(
        max_length=500,
        blank=True,
        help_text="GET with ?idempotency_key=K tells whether an uncertain call took effect (HTTP tools).",
    )
    probe_handler = models.CharField(
        max_length=200,
        blank=True,
        help_text="Registered Python probe for an uncertain call (python tools).",
    )
    precheck_url = models.URLField(
        max_length=500,
        blank=True,
        help_text='Before a resumed or forked run continues: POST {"tool", "arguments"} of the last call, '
        'answered {"ok": true} or {"ok": false, "reason": "..."} (HTTP tools).',
    )
    precheck_handler = models.CharField(
        max_length=200,
        blank=True,
        help_text="Registered Python check of the last call's arguments before a resumed or forked "
        "run continues: None/True holds, a string says what changed.",
    )
    idempotent = models.BooleanField(
        default=True,
        help_text="The tool honours the idempotency key, so a call may safely be sent again.",
    )
    timeout_s = models.FloatField(default=10.0)
    # runtime/retry.py; empty = the defaults (two attempts; README "Retry policies").
    retry = models.JSONField(
        default=dict,
        blank=True,
        help_text='Retry policy, e.g. {"attempts": 3, "backoff_base_s": 0.5, "backoff_max_s": 20, '
        '"on": ["timeout", "connect", "5xx", "429"], "retry_after_max_s": 60}; empty = defaults.',
    )
    side_effects = models.BooleanField(default=False)
    requires_approval = models.BooleanField(default=False)
    risk_level = models.PositiveSmallIntegerField(
        null=True,
        blank=True,
        help_text="0 (harmless) to 3: 3 always asks a person. Empty: assessed per call.",
    )
    approval_when = models.JSONField(
        null=True,
        blank=True,
        help_text='Ask a person when this holds for the arguments, e.g. {"field": "amount", "op": "gt", "value": 50}.',
    )
    approval_timeout_s = models.PositiveIntegerField(
        default=1800, help_text="How long an approval of this tool waits for a person."
    )
    approval_on_timeout = models.CharField(
        max_length=10,
        choices=[("reject", "reject"), ("approve", "approve"), ("escalate", "escalate")],
        default="reject",
        help_text="What the deadline does: reject, approve, or escalate to approval_escalate_to.",
    )
    approval_escalate_to = models.CharField(
        max_length=50, blank=True, help_text="The approver group an escalation goes to."
    )
    roles = ArrayField(models.CharField(max_length=50), default=list, blank=True)
    credit_cost = models.PositiveIntegerField(default=0)
    # A credit pool's request (billing CreditPool): CEL over `args` and `session`
    # (engine/gates/credit_pool.py); empty: the session's value, and credit_cost.
    value = models.CharField(
        max_length=1000,
        blank=True,
        help_text="CEL: a call's estimated value (default: the session's).",
    )
    cost = models.CharField(
        max_length=1000,
        blank=True,
        help_text="CEL: a call's estimated cost in points (default: credit_cost).",
    )
    critical = models.BooleanField(
        default=False, help_text="Still runs at degradation level 3 (only critical tools do)."
    )
    # The environment layer (engine/gates/surroundings.py): the service's declared health.
    sla_rate = models.FloatField(
        null=True,
        blank=True,
        validators=[MinValueValidator(0.0), MaxValueValidator(1.0)],
        help_text="Success rate the service promises, e.g. 0.95: a recent rate under it is "
        "shown to the model and, after a pause, is a drift.",
    )
    quota = models.JSONField(
        default=dict,
        blank=True,
        help_text='Calls the service allows per period, e.g. {"calls": 5000, "per": "day"} '
        "(minute, hour or day; days in BILLING_TIME_ZONE): the model sees what is left.",
    )
    # Per owner, shared by every worker process through Redis (billing/ratelimit.py); 0 = no limit.
    rate_limit_calls_per_min = models.PositiveIntegerField(default=0)
    rate_limit_tokens_per_min = models.PositiveIntegerField(default=0)
    enabled = models.BooleanField(default=True)
    mcp_server = models.ForeignKey(
        McpServer,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="tools",
        editable=False,
        help_text="MCP tools: the server that runs it (the row is rewritten by each refresh).",
    )
    mcp_tool = models.CharField(
        max_length=128,
        blank=True,
        editable=False,
        help_text="MCP tools: the tool's name on its server.",
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        # Beyond Django's four: a reset sends calls to a tool its breaker judged down.
        permissions = [("reset_breaker_tool", "Can reset a tool's breaker")]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        from django.core.exceptions import ValidationError
        from jsonschema import Draft202012Validator
        from jsonschema.exceptions import SchemaError

        try:
            Draft202012Validator.check_schema(self.parameters or {})
        except SchemaError as exc:
            raise ValidationError(
                {"parameters": f"not a valid JSON Schema: {exc.message}"}
            ) from None
        if (self.parameters or {}).get("type") != "object":
            raise ValidationError({"parameters": 'the top level must be {"type": "object"}'})
        if self.kind == ToolKind.HTTP and not self.url:
            raise ValidationError({"url": "required for HTTP tools"})
        if self.kind == ToolKind.PYTHON and not self.handler:
            raise ValidationError({"handler": "required for Python tools"})
        if self.kind == ToolKind.MCP and not (self.mcp_server_id and self.mcp_tool):
            raise ValidationError("MCP tools come from their server's refresh, not from this form")
        from approvals.conditions import ConditionError
        from approvals.conditions import validate as validate_condition

        try:
            validate_condition(self.approval_when)
        except ConditionError as exc:
            raise ValidationError({"approval_when": str(exc)}) from None
        from runtime.retry import retry_policy_problems

        self.retry = self.retry or {}  # an emptied form field: the defaults
        if problems := retry_policy_problems(self.retry):
            raise ValidationError({"retry": "; ".join(problems)})
        if self.risk_level is not None and self.risk_level > 3:
            raise ValidationError({"risk_level": "goes from 0 (harmless) to 3 (highest)"})
        if self.approval_on_timeout == "escalate" and not self.approval_escalate_to:
            raise ValidationError(
                {"approval_escalate_to": "required when approval_on_timeout is escalate"}
            )
        self.quota = self.quota or {}
        if problem := quota_problem(self.quota):
            raise ValidationError({"quota": problem})
        from .env_access import header_env_rule, refused_header_envs

        refused = refused_header_envs(self.headers)
        if refused:
            names = ", ".join(f"{header} reads {name}" for header, name in refused)
            raise ValidationError({"headers": f"{names}, but {header_env_rule()}"})
