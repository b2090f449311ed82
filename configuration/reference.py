"""The configuration reference, generated from what `apply_config` validates and stores.

One source of truth: each section's fields come from the JSON Schema the file is checked
against (configuration/schema.py), their defaults and descriptions from the columns they
are stored in. `python manage.py config_reference` prints it; docs/configuration-reference.md
is its output, and a test keeps the two equal.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from django.db.models import NOT_PROVIDED, Model
from django.db.models import fields as model_fields

from accounts.models import Role
from billing.models import CreditPool
from hooks.models import Schedule
from memory.models import EmbeddingEndpoint
from record.models import Agent, ModelEndpoint
from tools.models import TOOL_SETTINGS, McpServer, Tool

from . import services
from .schema import DOCUMENT


@dataclass(frozen=True)
class Section:
    key: str
    model: type[Model] | None
    # The entry's fields stored as the column of the same name.
    stored: tuple[str, ...]
    # Fields apply_config reads itself (the entry's name, references to other entries, the
    # parts that become several rows); each is named here with where it goes.
    read_by_apply: dict[str, str]
    intro: str


SECTIONS = (
    Section(
        "roles",
        Role,
        ("description",),
        {"name": "the role's unique name; tools and agents' sessions name it"},
        "Roles, declared before tools and keys name them.",
    ),
    Section(
        "models",
        ModelEndpoint,
        services.MODEL_FIELDS,
        {"name": "the endpoint's unique name; agents name it as `model`"},
        "Model endpoints: where a model is called and how its calls are priced and limited.",
    ),
    Section(
        "embeddings",
        EmbeddingEndpoint,
        services.EMBEDDINGS_FIELDS,
        {"name": "the endpoint's unique name; an agent's `memory` names it"},
        "Embedding endpoints for long-term memory (OpenAI-compatible `/v1/embeddings`).",
    ),
    Section(
        "tools",
        Tool,
        TOOL_SETTINGS,
        {"name": "the tool's unique name, as the model sees it"},
        "Tools the model may call: HTTP or Python, gated by role, validated by schema.",
    ),
    Section(
        "mcp_servers",
        McpServer,
        services.MCP_SERVER_FIELDS,
        {"name": "the server's unique name; its tools are `<name>.<tool>`"},
        "MCP servers whose tools agents may use (HTTP, or a stdio command a deployer sets).",
    ),
    Section(
        "agents",
        Agent,
        services.AGENT_MANAGED,
        {
            "slug": "the agent's unique slug: sessions, `agent.<slug>` tools and handoffs name it",
            "model": "the name of a `models` entry: the agent's main model",
            "fallback_model": "a `models` entry tried when the main model fails",
            "candidate_model": "a `models` entry for a gradual rollout (`candidate_percent`)",
        },
        "Agents: a system prompt, a model, tools, limits and budgets.",
    ),
    Section(
        "credit_pools",
        CreditPool,
        ("size", "enabled"),
        {
            "name": "the pool's unique name",
            "owner": "the username of the tenant whose calls use it; without: the global pool",
        },
        "Credit pools: points lent to paid tool calls in flight, granted highest value / cost "
        "first (see [Cost, credits and budgets](cost-and-budgets.md)).",
    ),
    Section(
        "workflows",
        None,
        (),
        {
            "slug": "the workflow's unique slug",
            "rules": "the offline `rules` model's rules for the workflow's `llm` nodes",
        },
        "Workflows: graphs of nodes; the rest of an entry is checked by the workflow parser "
        "(see [Workflows](workflows.md)), which names workflow, node and field.",
    ),
    Section(
        "schedules",
        Schedule,
        services.SCHEDULE_FIELDS,
        {
            "name": "the schedule's unique name; its runs' metadata carries it as `schedule`",
            "owner": "the username whose runs they are (and who is billed for them)",
            "api_key": "the prefix of one of the owner's active keys: its roles, its spend",
            "webhook": "`{url}`: called when each run ends (`Schedule.webhook_url`)",
        },
        "Schedules: a workflow run, or an agent's turn in a new session, on a cron expression "
        "in a time zone (see [Schedules and run webhooks](schedules-and-webhooks.md)).",
    ),
)


def _kind(schema: dict[str, Any]) -> str:
    """A short description of a JSON Schema: its type and the limits it sets."""
    if "oneOf" in schema:
        return " or ".join(_kind(option) for option in schema["oneOf"])
    if "enum" in schema:
        return "one of " + ", ".join(f"`{json.dumps(v)}`" for v in schema["enum"])
    kind = schema.get("type", "any")
    text = "/".join(kind) if isinstance(kind, list) else str(kind)
    if kind == "array" and isinstance(schema.get("items"), dict):
        item = schema["items"]
        text = f"list of {_kind(item) if 'properties' not in item else 'objects'}"
    limits = []
    for key, word in (
        ("minimum", "≥"),
        ("exclusiveMinimum", ">"),
        ("maximum", "≤"),
        ("exclusiveMaximum", "<"),
        ("minLength", "length ≥"),
        ("maxLength", "length ≤"),
        ("minItems", "items ≥"),
        ("maxItems", "items ≤"),
    ):
        if key in schema:
            limits.append(f"{word} {schema[key]}")
    if "pattern" in schema:
        limits.append(f"matching `{schema['pattern']}`")
    return text + (f" ({', '.join(limits)})" if limits else "")


def _default(column: model_fields.Field) -> str:
    default = column.default
    if default is NOT_PROVIDED:
        return "—" if not column.null else "none"
    if callable(default):
        default = default()
    if default in ("", None):
        return "empty" if default == "" else "none"
    return f"`{json.dumps(default, default=str)}`"


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _entry_schema(key: str) -> dict[str, Any]:
    sections: dict[str, Any] = DOCUMENT["properties"]  # type: ignore[assignment]
    entry: dict[str, Any] = sections[key]["items"]
    return entry


def unread_fields() -> list[str]:
    """Schema fields that apply_config neither stores nor reads: none may exist."""
    missing = []
    for section in SECTIONS:
        item = _entry_schema(section.key)
        for field in item.get("properties", {}):
            if field not in section.stored and field not in section.read_by_apply:
                missing.append(f"{section.key}.{field}")
    return missing


def reference_markdown() -> str:
    lines = [
        "# Configuration reference",
        "",
        "<!-- Generated by `python manage.py config_reference`; do not edit by hand. -->",
        "",
        "Every field `apply_config` accepts, with its type and limits (from the schema the",
        "file is checked against), its default and where it is stored. A field not listed",
        "here is refused, naming the entry and field. See [Configuration](configuration.md)",
        "for how a file is applied.",
    ]
    for section in SECTIONS:
        item = _entry_schema(section.key)
        required = set(item.get("required", ()))
        lines += ["", f"## `{section.key}`", "", section.intro, ""]
        lines += [
            "| field | type and limits | default | what reads it |",
            "| --- | --- | --- | --- |",
        ]
        for field, schema in item.get("properties", {}).items():
            column = None
            if section.model is not None and field in section.stored:
                try:
                    column = section.model._meta.get_field(field)
                except Exception:  # noqa: BLE001 - a field stored by another name
                    column = None
            default = (
                "required"
                if field in required
                else (_default(column) if isinstance(column, model_fields.Field) else "—")
            )
            if field in section.read_by_apply:
                where = section.read_by_apply[field]
            elif column is not None and section.model is not None:
                help_text = str(getattr(column, "help_text", "") or "")
                where = f"`{section.model.__name__}.{field}`" + (
                    f": {help_text}" if help_text else ""
                )
            else:
                where = "stored on the entry's row"
            lines.append(
                f"| `{field}` | {_cell(_kind(schema))} | {_cell(default)} | {_cell(where)} |"
            )
    return "\n".join(lines) + "\n"
