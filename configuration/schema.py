"""The declarative config file: its schema, and checks that name the wrong entry and field."""

import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError, ValidationError

from approvals.conditions import ConditionError
from approvals.conditions import validate as validate_condition
from evaluations.gate import rule_problem
from memory.budget import budget_problems
from memory.dialogue import dialogue_config_problem
from memory.tokens import TOKENIZER_NAMES
from record.models import DoubleTexting
from runtime.peak_hours import peak_hours_problems, time_zone
from runtime.retry import retry_policy_problems
from tools.env_access import header_env_allowed, header_env_rule
from tools.estimates import estimate_problems
from tools.execution import BUILTIN_TOOLS
from tools.models import QUOTA_PERIODS
from tools.registry import HANDLERS
from tools.stdio_policy import command_problem, env_problems
from workflows.definition import WorkflowInvalid, definition_parse
from workflows.expressions import ExpressionError, expression_compile

NAME = {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"}
# An agent's or a rule's tool: a tool's name, or an MCP server's `<server>.<tool>`.
TOOL_REF = {
    "type": "string",
    "pattern": "^([A-Za-z0-9_-]{1,64}|[a-z0-9][a-z0-9_-]{0,39}[.][A-Za-z0-9_.-]{1,128})$",
}
MCP_SERVER_NAME = {"type": "string", "pattern": "^[a-z0-9][a-z0-9_-]{0,39}$"}
SLUG = {"type": "string", "pattern": "^[a-z0-9][a-z0-9_-]{0,99}$"}
POSITIVE = {"type": "number", "exclusiveMinimum": 0}
NON_NEGATIVE = {"type": "number", "minimum": 0}
ENV_NAME = {"type": "string", "pattern": "^[A-Z_][A-Z0-9_]*$"}
HTTP_URL = {"type": "string", "pattern": "^https?://"}
# A URL, or `{env: NAME, default: "...", path: "..."}` resolved when the file is applied.
URL = {
    "oneOf": [
        HTTP_URL,
        {
            "type": "object",
            "additionalProperties": False,
            "required": ["env"],
            "properties": {
                "env": ENV_NAME,
                "default": HTTP_URL,
                "path": {"type": "string"},
            },
        },
    ]
}
URL_FIELDS = {
    "models": ("base_url",),
    "tools": ("url", "status_url", "precheck_url"),
    "mcp_servers": ("url",),
    "embeddings": ("base_url",),
}
URL_MAX_CHARS = 500  # the columns' max_length

MODEL_ENTRY = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "api"],
    "properties": {
        "name": SLUG,
        "api": {"enum": ["openai", "anthropic", "prompt_tools", "rules"]},
        "base_url": URL,
        "model": {"type": "string"},
        "api_key_env": {"type": "string", "pattern": "^[A-Z_][A-Z0-9_]*$"},
        "connect_timeout_s": POSITIVE,
        "first_token_timeout_s": POSITIVE,
        "total_timeout_s": POSITIVE,
        "price_input_per_1k": NON_NEGATIVE,
        "price_output_per_1k": NON_NEGATIVE,
        "credits_per_1k_tokens": NON_NEGATIVE,
        "context_window": {"type": "integer", "minimum": 256},
        "tokenizer": {"enum": [*TOKENIZER_NAMES, ""]},
        "tokenizer_ratio": {"type": ["number", "null"], "minimum": 0.5, "maximum": 10},
        "options": {"type": "object"},
        "rate_limit_calls_per_min": {"type": "integer", "minimum": 0},
        "rate_limit_tokens_per_min": {"type": "integer", "minimum": 0},
        "retry": {"type": "object"},
        "enabled": {"type": "boolean"},
    },
}

HEADERS = {
    "type": "object",
    "additionalProperties": {
        "oneOf": [
            {"type": "string"},
            {
                "type": "object",
                "additionalProperties": False,
                "required": ["env"],
                "properties": {"env": ENV_NAME},
            },
        ]
    },
}
ROLE_LIST = {"type": "array", "items": {"type": "string", "minLength": 1}}

MCP_SERVER_ENTRY = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name"],
    "properties": {
        "name": MCP_SERVER_NAME,
        "url": URL,
        "command": {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1},
        # The stdio process's environment (nothing else of the worker's is passed on).
        "env": {**HEADERS, "propertyNames": {"pattern": "^[A-Za-z_][A-Za-z0-9_]*$"}},
        "headers": HEADERS,
        "timeout_s": POSITIVE,
        "roles": ROLE_LIST,
        "tool_roles": {"type": "object", "additionalProperties": ROLE_LIST},
        "enabled": {"type": "boolean"},
    },
    "oneOf": [{"required": ["url"]}, {"required": ["command"]}],
}

# An OpenAI-compatible /v1/embeddings endpoint; the first enabled one is used (memory/embeddings.py).
EMBEDDINGS_ENTRY = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "base_url", "model", "dimension"],
    "properties": {
        "name": SLUG,
        "base_url": URL,
        "model": {"type": "string", "minLength": 1},
        "dimension": {"type": "integer", "minimum": 1, "maximum": 16000},
        "api_key_env": ENV_NAME,
        "timeout_s": POSITIVE,
        "enabled": {"type": "boolean"},
    },
}

# Agent.memory (engine/gates/memory.py MemorySettings).
AGENT_MEMORY = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "enabled": {"type": "boolean"},
        "top_k": {"type": "integer", "minimum": 0, "maximum": 50},
        "tags": {"type": "array", "items": {"type": "string", "minLength": 1}},
        "min_similarity": {"type": "number", "minimum": -1, "maximum": 1},
        "half_life_days": POSITIVE,
        "remember_phrases": {"type": "boolean"},
        "extraction": {"type": "boolean"},
    },
}

TOOL_ENTRY = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "description", "kind"],
    "properties": {
        "name": NAME,
        "description": {"type": "string", "minLength": 1},
        "result_description": {"type": "string"},
        "kind": {"enum": ["python", "http"]},
        "handler": {"type": "string"},
        "url": URL,
        "status_url": URL,
        "probe_handler": {"type": "string"},
        "precheck_url": URL,
        "precheck_handler": {"type": "string"},
        "idempotent": {"type": "boolean"},
        "method": {"enum": ["GET", "POST", "PUT", "PATCH", "DELETE"]},
        "headers": HEADERS,
        "parameters": {"type": "object"},
        "timeout_s": POSITIVE,
        "side_effects": {"type": "boolean"},
        "requires_approval": {"type": "boolean"},
        "risk_level": {"type": ["integer", "null"], "minimum": 0, "maximum": 3},
        "approval_when": {"type": ["object", "null"]},
        "approval_timeout_s": {"type": "integer", "minimum": 1},
        "approval_on_timeout": {"enum": ["reject", "approve", "escalate"]},
        "approval_escalate_to": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,50}$"},
        "roles": {"type": "array", "items": {"type": "string", "minLength": 1}},
        "credit_cost": {"type": "integer", "minimum": 0},
        # Its credit pool request (docs/cost-and-budgets.md): CEL over `args` and `session`.
        "value": {"type": "string", "minLength": 1, "maxLength": 1000},
        "cost": {"type": "string", "minLength": 1, "maxLength": 1000},
        "critical": {"type": "boolean"},
        "rate_limit_calls_per_min": {"type": "integer", "minimum": 0},
        "rate_limit_tokens_per_min": {"type": "integer", "minimum": 0},
        # The service's declared health (the environment layer: engine/gates/surroundings.py).
        "sla_rate": {"type": ["number", "null"], "minimum": 0, "maximum": 1},
        "quota": {
            "type": "object",
            "additionalProperties": False,
            "required": ["calls", "per"],
            "properties": {
                "calls": {"type": "integer", "minimum": 1},
                "per": {"enum": list(QUOTA_PERIODS)},
            },
        },
        "retry": {"type": "object"},
        "enabled": {"type": "boolean"},
    },
}

RULE = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string"},
        "when": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "user": {"type": "string"},
                "note": {"type": "string"},
                "last_tool": {"type": ["string", "null"]},
                "result": {"type": "string"},
                "truthy": {"type": "string"},
                "falsy": {"type": "string"},
            },
        },
        "answer": {"type": "string"},
        "for_each": {"type": "string"},
        "tool_calls": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["tool"],
                "properties": {"tool": TOOL_REF, "args": {"type": "object"}},
            },
        },
    },
    "oneOf": [{"required": ["answer"]}, {"required": ["tool_calls"]}],
}

AGENT_ENTRY = {
    "type": "object",
    "additionalProperties": False,
    "required": ["slug", "model"],
    "properties": {
        "slug": SLUG,
        "name": {"type": "string"},
        "system_prompt": {"type": "string"},
        "model": SLUG,
        "fallback_model": {"type": ["string", "null"]},
        "candidate_model": {"type": ["string", "null"]},
        "candidate_percent": {"type": "integer", "minimum": 0, "maximum": 100},
        # What the candidate's latest evaluation must show before candidate_percent rises.
        "rollout_gate": {"type": "object", "additionalProperties": {"type": "string"}},
        "tools": {"type": "array", "items": TOOL_REF},
        "max_iterations": {"type": "integer", "minimum": 1, "maximum": 100},
        "repeat_call_limit": {"type": "integer", "minimum": 2, "maximum": 20},
        "same_result_limit": {"type": "integer", "minimum": 1, "maximum": 20},
        "step_timeout_s": POSITIVE,
        "turn_timeout_s": POSITIVE,
        "context_window": {"type": "integer", "minimum": 256},
        "rules": {"type": "array", "items": RULE},
        # Intents and slots (memory/dialogue.py checks the details: regexes, names).
        "dialogue": {"type": "object"},
        "busy_message": {"type": "string"},
        "double_texting": {"enum": [choice.value for choice in DoubleTexting]},
        # What a session of this agent is worth by default (priority by value per point).
        "value": {"type": "number", "exclusiveMinimum": 0},
        "cheap_model": {"type": ["string", "null"]},
        "degraded_max_tokens": {"type": "integer", "minimum": 1},
        # Partition overrides of the context budget (memory/budget.py), checked below.
        "context_budget": {"type": "object"},
        "summary_model": {"type": ["string", "null"]},
        "budget_turn_tokens": {"type": ["integer", "null"], "minimum": 0},
        "budget_turn_cost": {"type": ["number", "null"], "minimum": 0},
        "budget_session_tokens": {"type": ["integer", "null"], "minimum": 0},
        "budget_session_cost": {"type": ["number", "null"], "minimum": 0},
        "budget_day_tokens": {"type": ["integer", "null"], "minimum": 0},
        "budget_day_cost": {"type": ["number", "null"], "minimum": 0},
        "memory": AGENT_MEMORY,
        # Busy windows "HH:MM-HH:MM" in `timezone` (runtime/peak_hours.py checks each).
        "peak_hours": {"type": "array", "items": {"type": "string"}},
        "timezone": {"type": "string"},
        "enabled": {"type": "boolean"},
        # Agents together (README "Agents together"): handoffs, nesting, routing.
        "handoffs": {"type": "array", "items": SLUG},
        "max_depth": {"type": "integer", "minimum": 0, "maximum": 5},
        "routing": {
            "type": "object",
            "additionalProperties": False,
            "required": ["small", "when"],
            "properties": {
                "small": SLUG,
                "when": {"type": "string", "minLength": 1},
                "escalate_on": {
                    "type": "array",
                    "items": {"enum": ["invalid_tool_call", "invalid_json"]},
                },
            },
        },
    },
}

# A credit pool (billing.CreditPool): global without an owner, else the tenant's.
CREDIT_POOL_ENTRY = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "size"],
    "properties": {
        "name": NAME,
        "owner": {"type": "string", "minLength": 1, "maxLength": 150},
        "size": {"type": "integer", "minimum": 1, "maximum": 10**12},
        "enabled": {"type": "boolean"},
    },
}

ROLE_ENTRY = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name"],
    "properties": {"name": SLUG, "description": {"type": "string"}},
}

SCHEDULE_ENTRY = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "cron", "owner"],
    "properties": {
        "name": NAME,
        "cron": {"type": "string", "minLength": 1, "maxLength": 120},
        "timezone": {"type": "string", "minLength": 1, "maxLength": 64},
        "workflow": SLUG,
        "input": {"type": "object"},
        "agent": SLUG,
        "message": {"type": "string", "minLength": 1},
        "owner": {"type": "string", "minLength": 1, "maxLength": 150},
        "api_key": {"type": "string", "minLength": 1, "maxLength": 12},
        "overlap": {"enum": ["skip", "queue", "allow"]},
        "enabled": {"type": "boolean"},
        "webhook": {
            "type": "object",
            "additionalProperties": False,
            "required": ["url"],
            "properties": {"url": {"type": "string", "minLength": 1, "maxLength": 500}},
        },
    },
}

DOCUMENT = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "roles": {"type": "array", "items": ROLE_ENTRY},
        "models": {"type": "array", "items": MODEL_ENTRY},
        "tools": {"type": "array", "items": TOOL_ENTRY},
        "mcp_servers": {"type": "array", "items": MCP_SERVER_ENTRY},
        "agents": {"type": "array", "items": AGENT_ENTRY},
        "embeddings": {"type": "array", "items": EMBEDDINGS_ENTRY},
        "credit_pools": {"type": "array", "items": CREDIT_POOL_ENTRY},
        "schedules": {"type": "array", "items": SCHEDULE_ENTRY},
        # The rest of a workflow is checked by its own parser (workflows/definition.py),
        # which names workflow, node and field.
        "workflows": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["slug"],
                "properties": {
                    "slug": {"type": "string"},
                    "rules": {"type": "array", "items": RULE},
                },
            },
        },
    },
}

_validator = Draft202012Validator(DOCUMENT)


def _where(document: dict[str, Any], path: list[Any]) -> str:
    """`agents[0] (support).model` from a jsonschema path."""
    if not path:
        return "file"
    out = str(path[0])
    if len(path) > 1 and isinstance(path[1], int):
        entry = (
            (document.get(path[0]) or [])[path[1]]
            if isinstance(document.get(path[0]), list)
            else None
        )
        # An agent is named by its slug (its `name` is a display label), like every other message here.
        label = (entry.get("slug") or entry.get("name")) if isinstance(entry, dict) else None
        out += f"[{path[1]}]" + (f" ({label})" if label else "")
        rest = path[2:]
    else:
        rest = path[1:]
    for part in rest:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


@dataclass(frozen=True)
class ResolvedUrl:
    """A URL field's value as stored, and where it came from (None: written out in the file)."""

    value: str
    env: str | None = None
    from_env: bool = False

    def describe(self) -> str:
        if self.env is None:
            return self.value
        origin = f"from {self.env}" if self.from_env else f"{self.env} not set: default"
        return f"{self.value} ({origin})"


def resolve_url(spec: str | Mapping[str, Any], environ: Mapping[str, str]) -> ResolvedUrl:
    """`{env, default, path}` -> the URL: the variable's value if set (non-empty), else the default,
    then `path` appended. ValueError says what is wrong."""
    if isinstance(spec, str):
        return ResolvedUrl(spec)
    name = spec["env"]
    value = environ.get(name, "").strip()
    from_env = bool(value)
    if not value:
        if "default" not in spec:
            raise ValueError(f"environment variable {name} is not set and no default is given")
        value = spec["default"]
    path = spec.get("path", "")
    url = value.rstrip("/") + "/" + path.lstrip("/") if path else value
    if from_env:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{name}={value!r} is not an http(s) URL")
    if len(url) > URL_MAX_CHARS:
        raise ValueError(f"the URL has {len(url)} characters; at most {URL_MAX_CHARS} fit")
    return ResolvedUrl(url, env=name, from_env=from_env)


def resolve_urls(
    document: dict[str, Any], environ: Mapping[str, str] | None = None
) -> tuple[dict[tuple[str, int, str], ResolvedUrl], list[str]]:
    """Every URL field of a schema-valid file, resolved; and the problems, each naming entry and field.

    The environment is read here, once, at apply time: the resolved URL is what
    is stored. It is an address, not a secret, so any variable may be named.
    """
    environ = os.environ if environ is None else environ
    resolved: dict[tuple[str, int, str], ResolvedUrl] = {}
    errors: list[str] = []
    for kind, fields in URL_FIELDS.items():
        for i, entry in enumerate(document.get(kind) or []):
            for field in fields:
                if field not in entry:
                    continue
                try:
                    resolved[(kind, i, field)] = resolve_url(entry[field], environ)
                except ValueError as exc:
                    errors.append(f"{_where(document, [kind, i, field])}: {exc}")
    return resolved, errors


def _specific(error: ValidationError) -> ValidationError:
    """For a value that fits no branch of a oneOf (a URL or `{env: ...}`), the branch of its own
    type says what is wrong ("does not match '^https?://'"), not "not valid under any of the given schemas"."""
    if error.validator != "oneOf":
        return error
    fitting = [e for e in error.context or () if e.validator != "type"]
    return fitting[0] if fitting else error


def _message(document: dict[str, Any], error: ValidationError) -> str:
    return f"{_where(document, list(error.absolute_path))}: {error.message}"


def url_problem(url: str, timeout_s: float = 2.0) -> str | None:
    """Can a TCP connection reach the URL's host and port, as the egress policy allows
    (runtime/egress.py)? None if so."""
    import socket

    from runtime import egress

    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        address = egress.addresses(parts.hostname or "", port)[0]
        with socket.create_connection((address, port), timeout=timeout_s):
            return None
    except egress.EgressRefused as exc:
        return str(exc)
    except OSError as exc:
        return f"cannot connect to {parts.hostname}:{port} ({exc.strerror or type(exc).__name__})"


def config_errors(
    document: Any,
    *,
    known_models: set[str],
    known_tools: set[str],
    known_roles: set[str] | None = None,
    known_mcp_servers: set[str] | None = None,
    check_urls: bool = False,
    known_tool_roles: Mapping[str, Collection[str]] | None = None,
    known_agents: set[str] | None = None,
    known_users: set[str] | None = None,
    known_pools: Mapping[str, str] | None = None,
) -> list[str]:
    """Every problem in the file, each naming its entry and field; empty if it is valid.
    `known_pools`: the pools in the database, each tenant's (its owner's username, "" for
    the global one) by name."""
    if not isinstance(document, dict):
        return ["file: the top level must be a mapping with models, tools and agents"]
    errors = [
        _message(document, _specific(e))
        for e in sorted(
            _validator.iter_errors(document), key=lambda e: list(map(str, e.absolute_path))
        )
    ]
    if errors:
        return errors
    for kind, key in (
        ("workflows", "slug"),
        ("roles", "name"),
        ("models", "name"),
        ("tools", "name"),
        ("mcp_servers", "name"),
        ("agents", "slug"),
        ("embeddings", "name"),
        ("credit_pools", "name"),
        ("schedules", "name"),
    ):
        seen: set[str] = set()
        for i, entry in enumerate(document.get(kind) or []):
            if entry[key] in seen:
                errors.append(
                    f"{kind}[{i}] ({entry[key]}).{key}: duplicate {key} '{entry[key]}' in this file"
                )
            seen.add(entry[key])
    for i, entry in enumerate(document.get("models") or []):
        if entry["api"] != "rules" and not entry.get("base_url"):
            errors.append(
                f"models[{i}] ({entry['name']}).base_url: required for api '{entry['api']}'"
            )
        for wrong in retry_policy_problems(entry.get("retry")):
            errors.append(f"models[{i}] ({entry['name']}).retry: {wrong}")
        # A ratio is read by an explicit estimate only: anywhere else it would mislead.
        tokenizer = entry.get("tokenizer") or ""
        if entry.get("tokenizer_ratio") is not None and tokenizer != "estimate":
            errors.append(
                f"models[{i}] ({entry['name']}).tokenizer_ratio: only with tokenizer: estimate "
                f"(this model's tokenizer is {tokenizer or 'its api default'})"
            )
    urls, url_errors = resolve_urls(document)
    errors.extend(url_errors)
    for i, entry in enumerate(document.get("tools") or []):
        where = f"tools[{i}] ({entry['name']})"
        for wrong in retry_policy_problems(entry.get("retry")):
            errors.append(f"{where}.retry: {wrong}")
        for header, value in (entry.get("headers") or {}).items():
            if isinstance(value, dict) and not header_env_allowed(value["env"]):
                errors.append(
                    f"{where}.headers.{header}: environment variable {value['env']} may not be read; "
                    f"{header_env_rule()}"
                )
        if entry["kind"] == "python":
            if not entry.get("handler"):
                errors.append(f"{where}.handler: required for python tools")
            elif entry["handler"] not in HANDLERS:
                errors.append(
                    f"{where}.handler: no registered Python handler '{entry['handler']}' "
                    f"(registered: {', '.join(sorted(HANDLERS))})"
                )
        if entry["kind"] == "http" and not entry.get("url"):
            errors.append(f"{where}.url: required for http tools")
        for field in ("probe_handler", "precheck_handler"):
            if entry.get(field) and entry[field] not in HANDLERS:
                errors.append(f"{where}.{field}: no registered Python handler '{entry[field]}'")
        if known_roles is not None:
            roles = known_roles | {r["name"] for r in document.get("roles") or []}
            for j, role in enumerate(entry.get("roles") or []):
                if role not in roles:
                    errors.append(
                        f"{where}.roles[{j}]: unknown role '{role}' (known: {', '.join(sorted(roles)) or 'none'}; declare it under roles:)"
                    )
        try:
            validate_condition(entry.get("approval_when"))
        except ConditionError as exc:
            inner = f".{exc.path.rstrip('.')}" if exc.path else ""
            errors.append(f"{where}.approval_when{inner}: {exc.message}")
        if entry.get("approval_on_timeout") == "escalate" and not entry.get("approval_escalate_to"):
            errors.append(
                f"{where}.approval_escalate_to: required when approval_on_timeout is escalate"
            )
        if check_urls and entry["kind"] == "http":
            for field in ("url", "status_url", "precheck_url"):
                if ("tools", i, field) in urls:
                    problem = url_problem(urls[("tools", i, field)].value)
                    if problem:
                        errors.append(f"{where}.{field}: unreachable: {problem}")
        for field in ("value", "cost"):
            if entry.get(field):
                errors.extend(f"{where}.{field}: {p}" for p in estimate_problems(entry[field]))
        params = entry.get("parameters")
        if params is not None:
            try:
                Draft202012Validator.check_schema(params)
            except SchemaError as exc:
                errors.append(f"{where}.parameters: not a valid JSON Schema: {exc.message}")
            else:
                if params.get("type") != "object":
                    errors.append(f"{where}.parameters: the top level must be {{type: object}}")
    errors.extend(_mcp_server_errors(document, known_roles))
    models = known_models | {m["name"] for m in document.get("models") or []}
    # Built in (ask_user, remember, recall): an agent lists them by name without an entry under tools.
    tools = known_tools | {t["name"] for t in document.get("tools") or []} | set(BUILTIN_TOOLS)
    servers = (known_mcp_servers or set()) | {s["name"] for s in document.get("mcp_servers") or []}
    for i, entry in enumerate(document.get("agents") or []):
        where = f"agents[{i}] ({entry['slug']})"
        for problem in budget_problems(entry.get("context_budget", {})):
            errors.append(f"{where}.context_budget: {problem}")
        for field in ("model", "fallback_model", "candidate_model", "cheap_model", "summary_model"):
            if entry.get(field) and entry[field] not in models:
                errors.append(
                    f"{where}.{field}: unknown model '{entry[field]}' (known: {', '.join(sorted(models)) or 'none'})"
                )
        problem = dialogue_config_problem(entry.get("dialogue"))
        if problem:
            errors.append(f"{where}.{problem}")
        errors += [
            f"{where}.peak_hours{p}" for p in peak_hours_problems(entry.get("peak_hours", []))
        ]
        zone = entry.get("timezone")
        if zone and time_zone(zone) is None:
            errors.append(
                f"{where}.timezone: unknown time zone {zone[:64]!r} (an IANA name, e.g. Asia/Shanghai)"
            )
        for metric, rule in (entry.get("rollout_gate") or {}).items():
            problem = rule_problem(metric, rule)
            if problem:
                errors.append(f"{where}.rollout_gate.{metric}: {problem}")
        known_agents_here = (known_agents or set()) | {
            a["slug"] for a in document.get("agents") or []
        }
        for j, slug in enumerate(entry.get("handoffs") or []):
            if slug not in known_agents_here or slug == entry["slug"]:
                errors.append(
                    f"{where}.handoffs[{j}]: unknown agent '{slug}' (known: "
                    f"{', '.join(sorted(known_agents_here - {entry['slug']})) or 'none'})"
                )
        routing = entry.get("routing")
        if routing:
            if routing["small"] not in models:
                errors.append(
                    f"{where}.routing.small: unknown model '{routing['small']}' (known: {', '.join(sorted(models)) or 'none'})"
                )
            errors.extend(
                f"{where}.routing.when: {p}" for p in routing_rule_problems(routing["when"])
            )
        for j, name in enumerate(entry.get("tools") or []):
            if name.startswith(AGENT_TOOL_PREFIX):
                if name.removeprefix(AGENT_TOOL_PREFIX) not in known_agents_here:
                    errors.append(
                        f"{where}.tools[{j}]: unknown agent '{name.removeprefix(AGENT_TOOL_PREFIX)}' "
                        f"for {name} (known: {', '.join(sorted(known_agents_here)) or 'none'})"
                    )
                continue
            if "." in name and name.split(".", 1)[0] in servers:
                continue  # checked against the server's list once it is discovered
            if name not in tools:
                errors.append(
                    f"{where}.tools[{j}]: unknown tool '{name}' (known: {', '.join(sorted(tools)) or 'none'})"
                )
    errors.extend(_credit_pool_errors(document, known_users, known_pools))
    errors.extend(
        _workflow_errors(
            document,
            known_tool_roles=known_tool_roles or {},
            known_agents=known_agents or set(),
            models=models,
        )
    )
    return errors


def _workflow_errors(
    document: dict[str, Any],
    *,
    known_tool_roles: Mapping[str, Collection[str]],
    known_agents: set[str],
    models: set[str],
) -> list[str]:
    """Each workflow parsed as it will be stored: every error names workflow, node and field."""
    tools: dict[str, Collection[str]] = {**known_tool_roles}
    for entry in document.get("tools") or []:
        tools[entry["name"]] = entry.get("roles") or ()
    agents = known_agents | {a["slug"] for a in document.get("agents") or []}
    errors: list[str] = []
    for i, entry in enumerate(document.get("workflows") or []):
        try:
            definition_parse(
                entry,
                where=f"workflows[{i}] ({entry['slug']})",
                known_tools=tools,
                known_agents=agents,
                known_models=models,
            )
        except WorkflowInvalid as exc:
            errors.extend(exc.errors)
    return errors


def _mcp_server_errors(document: dict[str, Any], known_roles: set[str] | None) -> list[str]:
    """Headers under the env-var rule of HTTP tools; roles that exist."""
    errors: list[str] = []
    roles = None
    if known_roles is not None:
        roles = known_roles | {r["name"] for r in document.get("roles") or []}
    for i, entry in enumerate(document.get("mcp_servers") or []):
        where = f"mcp_servers[{i}] ({entry['name']})"
        for header, value in (entry.get("headers") or {}).items():
            if isinstance(value, dict) and not header_env_allowed(value["env"]):
                errors.append(
                    f"{where}.headers.{header}: environment variable {value['env']} may not be read; "
                    f"{header_env_rule()}"
                )
        if entry.get("command") and entry.get("headers"):
            errors.append(f"{where}.headers: only for url servers (stdio has no headers)")
        if entry.get("command"):
            problem = command_problem(entry["command"])
            if problem:
                errors.append(f"{where}.command: {problem}")
            errors += [f"{where}.env.{line}" for line in env_problems(entry.get("env"))]
        elif entry.get("env"):
            errors.append(f"{where}.env: only for stdio servers (a command)")
        if roles is None:
            continue
        listed = [(f"roles[{j}]", r) for j, r in enumerate(entry.get("roles") or [])]
        for tool, names in (entry.get("tool_roles") or {}).items():
            listed += [(f"tool_roles.{tool}[{j}]", r) for j, r in enumerate(names)]
        for field, role in listed:
            if role not in roles:
                errors.append(
                    f"{where}.{field}: unknown role '{role}' (known: {', '.join(sorted(roles)) or 'none'}; declare it under roles:)"
                )
    return errors


AGENT_TOOL_PREFIX = "agent."  # engine/gates/children.py: another agent as a tool
ROUTING_NAMES = frozenset({"message", "length", "dialogue", "failures", "iteration"})


def routing_rule_problems(rule: str) -> list[str]:
    """A routing rule is CEL over the turn's names (engine/gates/routing.py)."""
    try:
        compiled = expression_compile(rule)
    except ExpressionError as exc:
        return [exc.message]
    unknown = sorted(compiled.names - ROUTING_NAMES)
    if unknown:
        return [
            f"names {', '.join(unknown)}; a routing rule may read "
            f"{', '.join(sorted(ROUTING_NAMES))}"
        ]
    return []


def _credit_pool_errors(
    document: dict[str, Any], known_users: set[str] | None, known_pools: Mapping[str, str] | None
) -> list[str]:
    """One pool per tenant and one global pool, in the file and with those in the database;
    a tenant is a user that exists."""
    errors = []
    taken = {owner: name for name, owner in (known_pools or {}).items()}
    for i, entry in enumerate(document.get("credit_pools") or []):
        where = f"credit_pools[{i}] ({entry['name']})"
        owner = entry.get("owner", "")
        if owner and known_users is not None and owner not in known_users:
            errors.append(f"{where}.owner: unknown user '{owner}'")
        holder = taken.get(owner)
        if holder is not None and holder != entry["name"]:
            whose = f"user '{owner}'" if owner else "the platform (no owner)"
            errors.append(f"{where}.owner: {whose} already has the credit pool '{holder}'")
        taken[owner] = entry["name"]
    return errors
