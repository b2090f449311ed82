"""The candidate `{"agent_version": "<agent slug>@<number>"}`: one of the agent's stored
configuration versions (record.AgentVersion), checked against the evaluated sessions'
agent and applied to the evaluation's candidate agent (a disabled copy)."""

import re
from decimal import Decimal
from typing import Any

from record.errors import InvalidInput
from record.models import Agent, AgentVersion, ModelEndpoint

FIELD = "candidate.agent_version"
_NAMED = re.compile(r"^(?P<slug>[-a-zA-Z0-9_]{1,100})@(?P<number>[1-9][0-9]{0,8})$")


def agent_version_find(value: Any) -> AgentVersion:
    """The version `value` ("<slug>@<number>") names; 400 naming the field otherwise."""
    named = _NAMED.match(value) if isinstance(value, str) else None
    if named is None:
        raise InvalidInput(
            'agent_version must be "<agent slug>@<version number>", e.g. "support@3"',
            details={"field": FIELD},
        )
    version = (
        AgentVersion.objects.select_related("agent")
        .filter(agent__slug=named["slug"], number=int(named["number"]))
        .first()
    )
    if version is None:
        raise InvalidInput(
            f"agent {named['slug']!r} has no configuration version {named['number']}",
            details={"field": FIELD},
            code="unknown_agent_version",
        )
    endpoints = {name for field, name in version.config.items() if name and _is_endpoint(field)}
    known = set(ModelEndpoint.objects.filter(name__in=endpoints).values_list("name", flat=True))
    if endpoints - known:
        raise InvalidInput(
            f"{value}: its model endpoint {sorted(endpoints - known)[0]!r} no longer exists",
            details={"field": FIELD},
            code="unknown_model",
        )
    return version


def agent_version_of_agent(value: Any, agent: Agent) -> AgentVersion:
    """The version, refused unless it is `agent`'s (the evaluated sessions' agent)."""
    version = agent_version_find(value)
    if version.agent_id != agent.pk:
        raise InvalidInput(
            f"{value} is a version of agent {version.agent.slug!r}; the sessions are of "
            f"agent {agent.slug!r}",
            details={"field": FIELD},
            code="agent_version_mismatch",
        )
    return version


def _is_endpoint(field: str) -> bool:
    found = next((f for f in Agent._meta.concrete_fields if f.name == field), None)
    return found is not None and found.is_relation and found.related_model is ModelEndpoint


def agent_version_apply(copy: Agent, value: str) -> None:
    """Set the copy's configuration to the version's snapshot (not saved). A field the
    snapshot lacks (added to agents after it was taken) keeps the agent's current value;
    one agents no longer have is ignored."""
    config = agent_version_find(value).config
    for field in Agent._meta.concrete_fields:
        if field.name not in config:
            continue
        stored = config[field.name]
        if field.is_relation:
            setattr(
                copy,
                field.name,
                ModelEndpoint.objects.get(name=stored) if stored is not None else None,
            )
        elif field.get_internal_type() == "DecimalField" and stored is not None:
            setattr(copy, field.attname, Decimal(stored))
        else:
            setattr(copy, field.attname, stored)
