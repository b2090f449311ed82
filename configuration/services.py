"""Applying a config file: models, tools, roles and agents created or updated by name.

Not session logic: an edge-ish service (the `apply_config` command, `make run`, the
test and benchmark fixtures call it) that writes rows of several apps at once.
"""

import dataclasses
import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import Model
from django.utils import timezone

from accounts.models import ApiKey, Role
from audit.diff import changes
from audit.models import AuditAction
from audit.selectors import admin_changed_fields
from audit.services import SYSTEM, audit_record
from billing.models import CreditPool
from evaluations.gate import rollout_gate_judge
from evaluations.services import rollout_override_audit
from hooks.models import Schedule
from hooks.selectors import schedule_next_times
from hooks.services import schedule_next_due, schedule_problems
from memory.models import EmbeddingEndpoint
from record.models import Agent, ModelEndpoint
from sessions.services import agent_version_record
from tools.descriptions import description_problems
from tools.env_access import HeaderEnvRefused
from tools.mcp import ListedTool, McpEndpoint, McpUnreachable
from tools.models import TOOL_SETTINGS, McpServer, Tool
from tools.services import mcp_server_list, mcp_tools_store
from workflows.definition import WorkflowInvalid
from workflows.models import Workflow
from workflows.selectors import definition_compile, tool_roles, workflow_definition_current
from workflows.services import workflow_apply

from .schema import AGENT_TOOL_PREFIX, config_errors, resolve_urls


class ConfigInvalid(Exception):
    def __init__(self, errors: list[str]) -> None:
        super().__init__("\n".join(errors))
        self.errors = errors


MODEL_FIELDS = (
    "api",
    "base_url",
    "model",
    "api_key_env",
    "connect_timeout_s",
    "first_token_timeout_s",
    "total_timeout_s",
    "price_input_per_1k",
    "price_output_per_1k",
    "credits_per_1k_tokens",
    "context_window",
    "tokenizer",
    "tokenizer_ratio",
    "options",
    "rate_limit_calls_per_min",
    "rate_limit_tokens_per_min",
    "retry",
    "enabled",
)
AGENT_FIELDS = (
    "name",
    "system_prompt",
    "tools",
    "handoffs",
    "max_depth",
    "routing",
    "max_iterations",
    "context_window",
    "rules",
    "dialogue",
    "busy_message",
    "double_texting",
    "value",
    "enabled",
    "candidate_percent",
    "rollout_gate",
    "repeat_call_limit",
    "same_result_limit",
    "step_timeout_s",
    "turn_timeout_s",
    "degraded_max_tokens",
    "budget_turn_tokens",
    "budget_session_tokens",
    "budget_day_tokens",
    "context_budget",
    "memory",
    "peak_hours",
    "timezone",
)
EMBEDDINGS_FIELDS = ("base_url", "model", "dimension", "api_key_env", "timeout_s", "enabled")
AGENT_COST_FIELDS = ("budget_turn_cost", "budget_session_cost", "budget_day_cost")
# Everything of an agent a file may set (its model, fallback and candidate are always set).
AGENT_MANAGED = (*AGENT_FIELDS, *AGENT_COST_FIELDS, "cheap_model", "summary_model")


def _rollout_gate_pass(
    entry: dict[str, Any], values: dict[str, Any], *, actor: str, override: bool
) -> None:
    """Refuse a raise of an existing agent's candidate_percent that its rollout gate does
    not allow (evaluations/gate.py), or record the override."""
    agent = Agent.objects.filter(slug=entry["slug"]).select_related("candidate_model").first()
    percent = values.get("candidate_percent")
    if agent is None or percent is None or percent <= agent.candidate_percent:
        return
    agent.rollout_gate = values.get("rollout_gate", agent.rollout_gate)
    candidate = values.get("candidate_model")
    verdict = rollout_gate_judge(agent, candidate_model=candidate.name if candidate else None)
    if verdict.passed:
        return
    if not override:
        raise ConfigInvalid(
            [
                f"agents ({entry['slug']}).candidate_percent: {agent.candidate_percent} -> "
                f"{percent}: {verdict.message()} (evaluate the candidate first, or apply "
                "with --override-rollout-gate)"
            ]
        )
    rollout_override_audit(
        agent=agent,
        actor=actor,
        before=agent.candidate_percent,
        after=percent,
        reason=verdict.message(),
        evaluation_id=verdict.evaluation.pk if verdict.evaluation else None,
    )


CONFIG_FILE = "configuration.file"  # the audit trail's object type of an applied file


def _audited(value: Any) -> Any:
    # A referenced row by its name (a model endpoint's, a user's, a key's), as the file names it.
    if isinstance(value, Model):
        for name in ("name", "slug", "username", "prefix"):
            if getattr(value, name, None):
                return getattr(value, name)
        return str(value.pk)
    return value


@dataclass
class _Trail:
    """What one run changed, entry by entry ("tool clock"), for its audit entry: the
    changed fields before and after (a created entry: None before, all its fields after)."""

    before: dict[str, Any] = dataclasses.field(default_factory=dict)
    after: dict[str, Any] = dataclasses.field(default_factory=dict)
    created: list[str] = dataclasses.field(default_factory=list)
    updated: list[str] = dataclasses.field(default_factory=list)
    unchanged: int = 0

    def note(self, entry: str, before: dict[str, Any] | None, after: dict[str, Any]) -> None:
        (self.updated if before is not None else self.created).append(entry)
        self.before[entry] = before
        self.after[entry] = after


def _upsert(
    model: Any,
    lookup: dict[str, Any],
    values: dict[str, Any],
    managed: Sequence[str] = (),
    *,
    trail: _Trail | None = None,
    entry: str = "",
) -> str:
    """Create or update one row; say which, or 'unchanged'. An unchanged row whose `managed`
    fields the file leaves out but the database holds otherwise (the admin changed them)
    says so, with the difference: applying the file does not take those back. What
    changed goes on the run's `trail` as `entry`."""
    trail = trail if trail is not None else _Trail()
    row = model.objects.filter(**lookup).first()
    if row is None:
        model.objects.create(**lookup, **values)
        trail.note(entry, None, {k: _audited(v) for k, v in {**lookup, **values}.items()})
        return "created"
    changed = [name for name, value in values.items() if getattr(row, name) != value]
    if not changed:
        trail.unchanged += 1
        drift = _drift(row, values, managed)
        return f"unchanged in the file; {drift}" if drift else "unchanged"
    trail.note(
        entry,
        {name: _audited(getattr(row, name)) for name in changed},
        {name: _audited(values[name]) for name in changed},
    )
    for name in changed:
        setattr(row, name, values[name])
    row.save()
    return "updated (" + ", ".join(changed) + ")"


def _workflow_trail(trail: _Trail, slug: str, before: dict[str, Any] | None) -> None:
    after = workflow_definition_current(slug=slug)
    if after is None or after == before:
        trail.unchanged += 1
        return
    if before is None:
        trail.note(f"workflow {slug}", None, {"definition": after})
        return
    old, new = changes({"definition": before}, {"definition": after})
    trail.note(f"workflow {slug}", old, new)


def _config_audit(trail: _Trail, report: list[str], document: Any, actor: str, source: str) -> None:
    """The run's one audit entry: which entries it created and updated, their changed
    fields before and after, and the file's digest (what was applied, to compare)."""
    digest = hashlib.sha256(json.dumps(document, sort_keys=True, default=str).encode()).hexdigest()
    audit_record(
        action=AuditAction.CONFIG_APPLY,
        actor=actor,
        object_type=CONFIG_FILE,
        # By its file name (an id is short); the whole path is the entry's name.
        object_id=os.path.basename(source) or digest[:16],
        object_repr=source[-200:] or f"configuration {digest[:16]}",
        before=trail.before,
        after=trail.after,
        data={
            "sha256": digest,
            "created": trail.created,
            "updated": trail.updated,
            "unchanged": trail.unchanged,
            "report": report,
        },
    )


def _shown(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= 60 else text[:59] + "…"


def _drift(row: Any, values: dict[str, Any], managed: Sequence[str]) -> str:
    """The fields the file leaves at their default that the row holds otherwise, as
    `the admin changed: a (now 3; the file: null, by admin:alice 2026-...)` for those the
    audit trail shows an admin edit of, `differs from the file: b (...)` for the rest."""
    edits = admin_changed_fields(object_type=row._meta.label_lower, object_id=row.pk)
    by_admin: list[str] = []
    other: list[str] = []
    for name in managed:
        if name in values:
            continue
        field = row._meta.get_field(name)
        now = getattr(row, field.attname)
        default = field.get_default()
        if field.is_relation:
            default = None
        if now == default or (now in (None, "") and default in (None, "")):
            continue
        line = f"{name} (now {_shown(now)}; the file: {_shown(default)}"
        entry = edits.get(field.attname) or edits.get(name)
        if entry is not None:
            when = timezone.localtime(entry.at).strftime("%Y-%m-%d %H:%M:%S")
            by_admin.append(f"{line}, by {entry.actor} {when})")
        else:
            other.append(line + ")")
    parts = []
    if by_admin:
        parts.append("the admin changed: " + ", ".join(by_admin))
    if other:
        parts.append("differs from the file: " + ", ".join(other))
    return "; ".join(parts)


MCP_SERVER_FIELDS = (
    "url",
    "command",
    "env",
    "headers",
    "timeout_s",
    "roles",
    "tool_roles",
    "enabled",
)


def _description_checks(document: dict[str, Any], strict: bool) -> tuple[list[str], list[str]]:
    """(errors, warnings) about the file's tool descriptions; strict makes them errors."""
    errors: list[str] = []
    warnings: list[str] = []
    for i, entry in enumerate(document.get("tools") or []):
        problems = description_problems(
            description=entry.get("description", ""),
            parameters=entry.get("parameters") or {},
            result_description=entry.get("result_description", ""),
        )
        for problem in problems:
            if strict:
                errors.append(f"tools[{i}] ({entry['name']}).description: {problem}")
            else:
                warnings.append(f"warning: tool {entry['name']}: {problem}")
    return errors, warnings


def _discover(
    document: dict[str, Any], urls: dict[tuple[str, int, str], Any], check_urls: bool
) -> tuple[dict[str, list[ListedTool] | None], list[str], list[str]]:
    """Each declared MCP server's tools, asked now (before any transaction: network calls).

    A server that cannot be asked is an error, or with check_urls off a
    warning (its stored tools stay as they are).
    """
    found: dict[str, list[ListedTool] | None] = {}
    errors: list[str] = []
    warnings: list[str] = []
    for i, entry in enumerate(document.get("mcp_servers") or []):
        url = urls.get(("mcp_servers", i, "url"))
        endpoint = McpEndpoint(
            name=entry["name"],
            url=url.value if url is not None else "",
            command=tuple(entry.get("command") or ()),
            headers=dict(entry.get("headers") or {}),
            env=dict(entry.get("env") or {}),
            timeout_s=float(entry.get("timeout_s", 10.0)),
        )
        if entry.get("enabled") is False:
            found[entry["name"]] = None
            continue
        try:
            found[entry["name"]] = mcp_server_list(endpoint=endpoint)
        except (McpUnreachable, HeaderEnvRefused) as exc:
            found[entry["name"]] = None
            if check_urls:
                errors.append(f"mcp_servers[{i}] ({entry['name']}): cannot list its tools: {exc}")
            else:
                warnings.append(
                    f"warning: mcp server {entry['name']}: cannot list its tools now ({exc}); "
                    "its stored tools are kept"
                )
    return found, errors, warnings


def _mcp_reference_errors(
    document: dict[str, Any], found: dict[str, list[ListedTool] | None], known_tools: set[str]
) -> list[str]:
    """Agents' `<server>.<tool>` entries that the server does not list."""
    errors: list[str] = []
    for i, entry in enumerate(document.get("agents") or []):
        for j, name in enumerate(entry.get("tools") or []):
            if "." not in name or name.startswith(AGENT_TOOL_PREFIX):
                continue  # another agent as a tool: checked with the file (schema.py)
            server, tool = name.split(".", 1)
            if server in found:
                listed = found[server]
                if listed is None or tool in {t.name for t in listed}:
                    continue
                names = ", ".join(sorted(t.name for t in listed)) or "none"
                errors.append(
                    f"agents[{i}] ({entry['slug']}).tools[{j}]: MCP server '{server}' lists no tool "
                    f"'{tool}' (it lists: {names})"
                )
            elif name not in known_tools:
                errors.append(
                    f"agents[{i}] ({entry['slug']}).tools[{j}]: unknown MCP tool '{name}' "
                    f"(refresh server '{server}' or declare it under mcp_servers:)"
                )
    return errors


def _pool_owners(document: Any) -> set[str]:
    """The users the file's credit pools name that exist (one query, only when there are)."""
    if not isinstance(document, dict) or not isinstance(document.get("credit_pools"), list):
        return set()
    names = {
        str(p["owner"]) for p in document["credit_pools"] if isinstance(p, dict) and p.get("owner")
    }
    if not names:
        return set()
    field = get_user_model().USERNAME_FIELD
    return set(
        get_user_model().objects.filter(**{f"{field}__in": names}).values_list(field, flat=True)
    )


def _user(username: str) -> Any:
    return get_user_model().objects.get(**{get_user_model().USERNAME_FIELD: username})


# What a schedules: entry sets on its row (name, owner, api_key and webhook are read apart).
SCHEDULE_FIELDS = (
    "cron",
    "timezone",
    "workflow",
    "input",
    "agent",
    "message",
    "overlap",
    "enabled",
)
# A change to any of these moves a schedule's next due time on from now.
SCHEDULE_TIMING = ("cron", "timezone", "enabled")


def _schedule_errors(
    document: dict[str, Any],
) -> tuple[list[str], dict[str, tuple[Any, ApiKey | None]]]:
    """Each schedule's problems, named by entry and field, and its owner and key."""
    entries = document.get("schedules") or []
    if not entries:
        return [], {}
    roles = dict(Workflow.objects.values_list("slug", "role"))
    roles.update({w["slug"]: w.get("role", "") for w in document.get("workflows") or []})
    agents = set(Agent.objects.filter(workflow__isnull=True).values_list("slug", flat=True))
    agents |= {a["slug"] for a in document.get("agents") or []}
    errors: list[str] = []
    refs: dict[str, tuple[Any, ApiKey | None]] = {}
    for i, entry in enumerate(entries):
        workflow = entry.get("workflow", "")
        problems = schedule_problems(
            cron=entry["cron"],
            zone=entry.get("timezone", "UTC"),
            workflow=workflow,
            agent=entry.get("agent", ""),
            message=entry.get("message", ""),
            webhook_url=(entry.get("webhook") or {}).get("url", ""),
            known_workflows=set(roles),
            known_agents=agents,
        )
        if "input" in entry and not workflow:
            problems.setdefault("input", "only with a workflow (an agent's turn takes a message)")
        owner = get_user_model().objects.filter(username=entry["owner"]).first()
        key = None
        if owner is None:
            problems["owner"] = f"unknown user '{entry['owner']}'"
        elif entry.get("api_key"):
            key = ApiKey.objects.filter(
                owner=owner, prefix=entry["api_key"], is_active=True
            ).first()
            if key is None:
                problems["api_key"] = (
                    f"no active key of {owner.get_username()} with the prefix '{entry['api_key']}'"
                )
            elif workflow in roles and roles[workflow] not in key.roles:
                problems["api_key"] = (
                    f"the key does not hold workflow {workflow}'s role '{roles[workflow]}'"
                )
        errors += [f"schedules[{i}] ({entry['name']}).{f}: {p}" for f, p in problems.items()]
        refs[entry["name"]] = (owner, key)
    return errors, refs


def _schedule_apply(entry: dict[str, Any], refs: tuple[Any, ApiKey | None], trail: _Trail) -> str:
    """Create or update one schedule; a new one, or a new cron, zone or enabled, is due next
    from now. Its report line names its next fire time."""
    name = entry["name"]
    values: dict[str, Any] = {
        "cron": entry["cron"],
        "timezone": entry.get("timezone", "UTC"),
        "workflow": entry.get("workflow", ""),
        "input": entry.get("input", {}),
        "agent": entry.get("agent", ""),
        "message": entry.get("message", ""),
        "overlap": entry.get("overlap", "skip"),
        "enabled": entry.get("enabled", True),
        "owner": refs[0],
        "api_key": refs[1],
        "webhook_url": (entry.get("webhook") or {}).get("url", ""),
    }
    before = Schedule.objects.filter(name=name).values(*SCHEDULE_TIMING).first()
    done = _upsert(
        Schedule, {"name": name}, values, SCHEDULE_FIELDS, trail=trail, entry=f"schedule {name}"
    )
    row = Schedule.objects.get(name=name)
    if before is None or any(before[f] != getattr(row, f) for f in SCHEDULE_TIMING):
        row.next_due_at = schedule_next_due(schedule=row) if row.enabled else None
        row.save(update_fields=["next_due_at", "updated_at"])
    if not row.enabled:
        return f"schedule {name}: {done}; disabled"
    upcoming = schedule_next_times(schedule=row, count=1)
    return (
        f"schedule {name}: {done}; next {upcoming[0]:%Y-%m-%d %H:%M %Z}"
        if upcoming
        else f"schedule {name}: {done}"
    )


def config_apply(
    *,
    document: Any,
    check_urls: bool = False,
    strict: bool | None = None,
    each_mcp_warning: bool = False,
    actor: str = SYSTEM,
    source: str = "",
    override_rollout_gate: bool = False,
    texts: Mapping[str, str] | None = None,
) -> list[str]:
    """Create or update roles, models, tools, MCP servers, agents and credit pools by name, all
    or nothing. `texts`: each workflow's YAML as written in the file, by slug (the admin's
    editor shows it).

    1. Check the whole file first (structure, references, tool schemas,
       handlers, URLs from the environment) and each tool's description
       (warnings; errors when strict, by default the TOOL_DESCRIPTIONS_STRICT
       setting); any error raises ConfigInvalid and nothing is written.
    2. Ask each MCP server for its tools (outside any transaction) and check
       the agents' `<server>.<tool>` entries against them.
    3. In one transaction, upsert models, then tools, then MCP servers and
       their tools, then agents; a URL written `{env: NAME, default, path}`
       is stored resolved.
    4. Return one line per entry saying what changed (and the URL each
       `{env: ...}` form resolved to; per MCP server, the tools added,
       removed and changed), then the `warning:` lines: models whose key
       variable is not set here, and descriptions that do not help the model
       (an MCP server's as one line with their count, unless `each_mcp_warning`).
    5. In the same transaction, one audit entry for the run, by `actor`, about the file
       `source`: each entry created or updated, with its changed fields before and after.
    """
    strict = settings.TOOL_DESCRIPTIONS_STRICT if strict is None else strict
    known_tools = set(Tool.objects.values_list("name", flat=True))
    errors = config_errors(
        document,
        known_models=set(ModelEndpoint.objects.values_list("name", flat=True)),
        known_tools=known_tools,
        known_roles=set(Role.objects.values_list("name", flat=True)),
        known_mcp_servers=set(McpServer.objects.values_list("name", flat=True)),
        check_urls=check_urls,
        known_tool_roles=tool_roles(),
        known_agents=set(
            Agent.objects.filter(workflow__isnull=True).values_list("slug", flat=True)
        ),
        known_users=_pool_owners(document),
        known_pools={
            name: owner or ""
            for name, owner in CreditPool.objects.values_list(
                "name", f"owner__{get_user_model().USERNAME_FIELD}"
            )
        },
    )
    if errors:
        raise ConfigInvalid(errors)
    errors, description_warnings = _description_checks(document, strict)
    if errors:
        raise ConfigInvalid(errors)
    urls, _ = resolve_urls(document)
    discovered, errors, discovery_warnings = _discover(document, urls, check_urls)
    errors += _mcp_reference_errors(document, discovered, known_tools)
    schedule_errors, schedule_refs = _schedule_errors(document)
    errors += schedule_errors
    if errors:
        raise ConfigInvalid(errors)

    def resolved(kind: str, index: int, values: dict[str, Any]) -> str:
        """Put the resolved URLs into `values`; describe those that came from an `{env: ...}` form."""
        notes = []
        for (k, i, field), url in urls.items():
            if (k, i) == (kind, index):
                values[field] = url.value
                if url.env is not None:
                    notes.append(f"; {field} {url.describe()}")
        return "".join(notes)

    report: list[str] = []
    warnings: list[str] = []
    trail = _Trail()
    with transaction.atomic():
        for entry in document.get("roles") or []:
            values = {"description": entry.get("description", "")}
            done = _upsert(
                Role,
                {"name": entry["name"]},
                values,
                ("description",),
                trail=trail,
                entry=f"role {entry['name']}",
            )
            report.append(f"role {entry['name']}: {done}")
        for i, entry in enumerate(document.get("models") or []):
            values = {k: entry[k] for k in MODEL_FIELDS if k in entry}
            for price in ("price_input_per_1k", "price_output_per_1k", "credits_per_1k_tokens"):
                if price in values:
                    values[price] = Decimal(str(values[price]))
            notes = resolved("models", i, values)
            done = _upsert(
                ModelEndpoint,
                {"name": entry["name"]},
                values,
                MODEL_FIELDS,
                trail=trail,
                entry=f"model {entry['name']}",
            )
            report.append(f"model {entry['name']}: {done}{notes}")
            key_env = entry.get("api_key_env")
            if key_env and not os.environ.get(key_env):
                warnings.append(
                    f"warning: model {entry['name']}: api_key_env {key_env} is not set in this "
                    "environment; its calls are refused until the worker has it"
                )
        for i, entry in enumerate(document.get("embeddings") or []):
            values = {k: entry[k] for k in EMBEDDINGS_FIELDS if k in entry}
            notes = resolved("embeddings", i, values)
            done = _upsert(
                EmbeddingEndpoint,
                {"name": entry["name"]},
                values,
                EMBEDDINGS_FIELDS,
                trail=trail,
                entry=f"embeddings {entry['name']}",
            )
            report.append(f"embeddings {entry['name']}: {done}{notes}")
            key_env = entry.get("api_key_env")
            if key_env and not os.environ.get(key_env):
                warnings.append(
                    f"warning: embeddings {entry['name']}: api_key_env {key_env} is not set in "
                    "this environment; memory falls back to no vectors until it is"
                )
        for i, entry in enumerate(document.get("tools") or []):
            values = {k: entry[k] for k in TOOL_SETTINGS if k in entry}
            values.setdefault("parameters", {"type": "object", "properties": {}})
            notes = resolved("tools", i, values)
            done = _upsert(
                Tool,
                {"name": entry["name"]},
                values,
                TOOL_SETTINGS,
                trail=trail,
                entry=f"tool {entry['name']}",
            )
            report.append(f"tool {entry['name']}: {done}{notes}")
        for i, entry in enumerate(document.get("mcp_servers") or []):
            values = {k: entry[k] for k in MCP_SERVER_FIELDS if k in entry}
            notes = resolved("mcp_servers", i, values)
            done = _upsert(
                McpServer,
                {"name": entry["name"]},
                values,
                MCP_SERVER_FIELDS,
                trail=trail,
                entry=f"mcp server {entry['name']}",
            )
            report.append(f"mcp server {entry['name']}: {done}{notes}")
            listed = discovered.get(entry["name"])
            if listed is not None:
                server = McpServer.objects.get(name=entry["name"])
                diff = mcp_tools_store(server=server, listed=listed)
                report += diff.lines()
                description_warnings += [
                    f"warning: {w}"
                    for w in diff.warning_lines(
                        each=each_mcp_warning,
                        see="see them with apply_config -v 2 or on each tool's admin page",
                    )
                ]
        for entry in document.get("agents") or []:
            values = {k: entry[k] for k in AGENT_FIELDS if k in entry}
            for budget in AGENT_COST_FIELDS:
                if budget in entry:
                    cost = entry[budget]
                    values[budget] = None if cost is None else Decimal(str(cost))
            values["model"] = ModelEndpoint.objects.get(name=entry["model"])
            # The fallback and the candidate are the file's: left out, there is none; the
            # cheap and summary models are changed only where the entry names them.
            for role in ("cheap_model", "summary_model", "fallback_model", "candidate_model"):
                if role in entry or role in ("fallback_model", "candidate_model"):
                    name = entry.get(role)
                    values[role] = ModelEndpoint.objects.get(name=name) if name else None
            _rollout_gate_pass(entry, values, actor=actor, override=override_rollout_gate)
            done = _upsert(
                Agent,
                {"slug": entry["slug"]},
                values,
                AGENT_MANAGED,
                trail=trail,
                entry=f"agent {entry['slug']}",
            )
            # A new version when its configuration differs from the latest (an agent
            # that has none yet gets its first even when the file changes nothing).
            agent_version_record(
                agent=Agent.objects.get(slug=entry["slug"]), actor=actor, source="config"
            )
            report.append(f"agent {entry['slug']}: {done}")
        for entry in document.get("credit_pools") or []:
            owner = entry.get("owner")
            values = {
                "size": entry["size"],
                "enabled": entry.get("enabled", True),
                "owner": _user(owner) if owner else None,
            }
            done = _upsert(
                CreditPool,
                {"name": entry["name"]},
                values,
                ("size", "enabled"),
                trail=trail,
                entry=f"credit pool {entry['name']}",
            )
            report.append(f"credit pool {entry['name']}: {done}")
        default_model = (document.get("models") or [{}])[0].get("name")
        for i, entry in enumerate(document.get("workflows") or []):
            where = f"workflows[{i}] ({entry['slug']})"
            before = workflow_definition_current(slug=entry["slug"])
            try:
                definition = definition_compile(entry, where=where)
                report.append(
                    workflow_apply(
                        definition=definition,
                        where=where,
                        default_model=default_model,
                        text=(texts or {}).get(entry["slug"], ""),
                    )
                )
            except WorkflowInvalid as exc:
                raise ConfigInvalid(exc.errors) from None
            _workflow_trail(trail, entry["slug"], before)
        for entry in document.get("schedules") or []:
            report.append(_schedule_apply(entry, schedule_refs[entry["name"]], trail))
        _config_audit(trail, report, document, actor, source)
    return report + warnings + discovery_warnings + description_warnings
