"""Applying a config file: models, tools, roles and agents created or updated by name.

Not session logic: an edge-ish service (the `apply_config` command, `make run`, the
test and benchmark fixtures call it) that writes rows of several apps at once.
"""

import os
from decimal import Decimal
from typing import Any

from django.db import transaction

from accounts.models import Role
from sessions.models import Agent, ModelEndpoint
from tools.models import Tool

from .schema import config_errors, resolve_urls


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
    "options",
    "rate_limit_calls_per_min",
    "rate_limit_tokens_per_min",
    "enabled",
)
TOOL_FIELDS = (
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
    "critical",
    "rate_limit_calls_per_min",
    "rate_limit_tokens_per_min",
    "enabled",
)
AGENT_FIELDS = (
    "name",
    "system_prompt",
    "tools",
    "max_iterations",
    "context_window",
    "rules",
    "busy_message",
    "double_texting",
    "value",
    "enabled",
    "candidate_percent",
    "repeat_call_limit",
    "same_result_limit",
    "step_timeout_s",
    "turn_timeout_s",
    "degraded_max_tokens",
    "budget_turn_tokens",
    "budget_session_tokens",
    "budget_day_tokens",
)
AGENT_COST_FIELDS = ("budget_turn_cost", "budget_session_cost", "budget_day_cost")


def _upsert(model: Any, lookup: dict[str, Any], values: dict[str, Any]) -> str:
    """Create or update one row; say which, or 'unchanged'."""
    row = model.objects.filter(**lookup).first()
    if row is None:
        model.objects.create(**lookup, **values)
        return "created"
    changed = [name for name, value in values.items() if getattr(row, name) != value]
    if not changed:
        return "unchanged"
    for name in changed:
        setattr(row, name, values[name])
    row.save()
    return "updated (" + ", ".join(changed) + ")"


def config_apply(*, document: Any, check_urls: bool = False) -> list[str]:
    """Create or update models, tools and agents by name, all or nothing.

    1. Check the whole file first (structure, references, tool schemas,
       handlers, URLs from the environment); any problem raises ConfigInvalid
       and nothing is written.
    2. In one transaction, upsert models, then tools, then agents; a URL
       written `{env: NAME, default, path}` is stored resolved.
    3. Return one line per entry saying what changed (and the URL each
       `{env: ...}` form resolved to), then a `warning:` line per model whose
       key variable is not set here.
    """
    errors = config_errors(
        document,
        known_models=set(ModelEndpoint.objects.values_list("name", flat=True)),
        known_tools=set(Tool.objects.values_list("name", flat=True)),
        known_roles=set(Role.objects.values_list("name", flat=True)),
        check_urls=check_urls,
    )
    if errors:
        raise ConfigInvalid(errors)
    urls, _ = resolve_urls(document)

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
    with transaction.atomic():
        for entry in document.get("roles") or []:
            values = {"description": entry.get("description", "")}
            report.append(f"role {entry['name']}: {_upsert(Role, {'name': entry['name']}, values)}")
        for i, entry in enumerate(document.get("models") or []):
            values = {k: entry[k] for k in MODEL_FIELDS if k in entry}
            for price in ("price_input_per_1k", "price_output_per_1k", "credits_per_1k_tokens"):
                if price in values:
                    values[price] = Decimal(str(values[price]))
            notes = resolved("models", i, values)
            report.append(
                f"model {entry['name']}: {_upsert(ModelEndpoint, {'name': entry['name']}, values)}{notes}"
            )
            key_env = entry.get("api_key_env")
            if key_env and not os.environ.get(key_env):
                warnings.append(
                    f"warning: model {entry['name']}: api_key_env {key_env} is not set in this "
                    "environment; its calls are refused until the worker has it"
                )
        for i, entry in enumerate(document.get("tools") or []):
            values = {k: entry[k] for k in TOOL_FIELDS if k in entry}
            values.setdefault("parameters", {"type": "object", "properties": {}})
            notes = resolved("tools", i, values)
            report.append(
                f"tool {entry['name']}: {_upsert(Tool, {'name': entry['name']}, values)}{notes}"
            )
        for entry in document.get("agents") or []:
            values = {k: entry[k] for k in AGENT_FIELDS if k in entry}
            for budget in AGENT_COST_FIELDS:
                if budget in entry:
                    cost = entry[budget]
                    values[budget] = None if cost is None else Decimal(str(cost))
            if "cheap_model" in entry:
                cheap = entry["cheap_model"]
                values["cheap_model"] = ModelEndpoint.objects.get(name=cheap) if cheap else None
            values["model"] = ModelEndpoint.objects.get(name=entry["model"])
            fallback = entry.get("fallback_model")
            values["fallback_model"] = (
                ModelEndpoint.objects.get(name=fallback) if fallback else None
            )
            candidate = entry.get("candidate_model")
            values["candidate_model"] = (
                ModelEndpoint.objects.get(name=candidate) if candidate else None
            )
            report.append(
                f"agent {entry['slug']}: {_upsert(Agent, {'slug': entry['slug']}, values)}"
            )
    return report + warnings
