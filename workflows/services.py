"""Writes of workflows: storing a validated definition as a new version, starting a run.

A run is a session of the workflow's runtime agent (its model endpoints serve the llm and
choice nodes, its tools are the tools the nodes name) that points at the version it
started with; its first message is the run's input, and its turn walks the graph.
"""

import json
import time
from typing import Any

from django.contrib.auth.models import User
from django.db import connection, transaction
from jsonschema import Draft202012Validator

from audit.diff import changes
from audit.models import AuditAction
from audit.services import audit_record
from engine import turn_start
from hooks.outbox import webhook_target_add, webhook_url_check
from memory.tokens import count_message_tokens
from record import dispatch
from record.errors import Conflict, InvalidInput, NotFound
from record.models import Agent, Message, ModelEndpoint, Session
from sessions.services import session_role_check

from .definition import Definition, WorkflowInvalid
from .graph_svg import REVISION, workflow_picture
from .models import Workflow, WorkflowPicture, WorkflowVersion
from .selectors import version_definition
from .state import RunState

RUNTIME_AGENT_PREFIX = "workflow-"
DEFAULT_STEP_TIMEOUT_S = 60.0


def runtime_agent_slug(slug: str) -> str:
    return f"{RUNTIME_AGENT_PREFIX}{slug}"[:100]


def _node_tools(definition: Definition) -> list[str]:
    names: set[str] = set()
    for node in definition.nodes.values():
        for each in (node, node.inner, *node.branches.values()):
            if each is not None and each.kind == "tool" and each.tool:
                names.add(each.tool)
    return sorted(names)


def _step_timeout(definition: Definition) -> float:
    """A step's tool calls share one time limit: the longest a node allows, 60 s at least."""
    limits = [DEFAULT_STEP_TIMEOUT_S]
    for node in definition.nodes.values():
        for each in (node, node.inner, *node.branches.values()):
            if each is not None and each.kind == "tool" and each.timeout_s:
                limits.append(float(each.timeout_s))
    return max(limits)


def _endpoint(definition: Definition, default_model: str | None, where: str) -> ModelEndpoint:
    name = definition.model or default_model
    endpoint = (
        ModelEndpoint.objects.filter(name=name).first()
        if name
        else ModelEndpoint.objects.filter(enabled=True).order_by("name").first()
    )
    if endpoint is None:
        raise WorkflowInvalid(
            [f"{where}.model: no model endpoint to serve its llm and choice nodes; declare one"]
        )
    return endpoint


def runtime_agent_values(definition: Definition, endpoint: ModelEndpoint) -> dict[str, Any]:
    """What a version asks of the agent its runs run as: the endpoint serving its llm and
    choice nodes, the tools its nodes name, its rules, the step time limit. The runtime
    agent is kept in step with the current version; an evaluation's candidate agent is
    set to a candidate version's (evaluations/workflow_replay.py)."""
    return {
        "model": endpoint,
        "tools": _node_tools(definition),
        "rules": list(definition.raw.get("rules") or []),
        "step_timeout_s": _step_timeout(definition),
    }


def version_endpoint(definition: Definition, default_model: str | None) -> ModelEndpoint:
    """The endpoint serving a version's llm and choice nodes (its `model`, else the default)."""
    return _endpoint(definition, default_model, f"workflow {definition.slug}")


def _kept(model: Any, lookup: dict[str, Any], values: dict[str, Any]) -> Any:
    """The row by `lookup` with `values`, written only when something differs (a file
    applied again changes nothing, not even a timestamp)."""
    row = model.objects.select_for_update().filter(**lookup).first()
    if row is None:
        return model.objects.create(**lookup, **values)
    if any(getattr(row, name) != value for name, value in values.items()):
        for name, value in values.items():
            setattr(row, name, value)
        row.save()
    return row


def workflow_apply(
    *,
    definition: Definition,
    where: str,
    default_model: str | None = None,
    source: str = "config",
    user: User | None = None,
    text: str = "",
) -> str:
    """Store a validated workflow: its runtime agent kept in step, and a new version when
    the definition changed (runs keep the version they started with). Returns what changed.
    `text`: the YAML as its author wrote it, which the admin's editor shows again (a change
    of comments or layout alone is kept on the current version, not a new one).

    Inside the caller's transaction when there is one (apply_config applies a whole file at
    once), else in its own.
    """
    with transaction.atomic():
        return _workflow_store(definition, where, default_model, source, user, text)


def _workflow_store(
    definition: Definition,
    where: str,
    default_model: str | None,
    source: str,
    user: User | None,
    text: str,
) -> str:
    raw = definition.raw
    endpoint = _endpoint(definition, default_model, where)
    agent_slug = runtime_agent_slug(definition.slug)
    taken = Agent.objects.filter(slug=agent_slug, workflow__isnull=True).exists()
    if taken:
        raise WorkflowInvalid(
            [
                f"{where}.slug: an agent named '{agent_slug}' exists; workflows keep that name for their runs"
            ]
        )
    agent_values: dict[str, Any] = {
        "name": f"Workflow {definition.name or definition.slug}",
        **runtime_agent_values(definition, endpoint),
        "enabled": True,
    }
    agent = _kept(Agent, {"slug": agent_slug}, agent_values)
    workflow = _kept(
        Workflow,
        {"slug": definition.slug},
        {
            "name": definition.name,
            "description": definition.description,
            "role": definition.role,
            "enabled": True,
            "runtime_agent": agent,
        },
    )
    created = workflow.current_version == 0
    latest = (
        WorkflowVersion.objects.filter(workflow=workflow, number=workflow.current_version).first()
        if workflow.current_version
        else None
    )
    if latest is not None and latest.definition == raw:
        if text and latest.text != text:
            WorkflowVersion.objects.filter(pk=latest.pk).update(text=text)
        return f"workflow {definition.slug}: unchanged (version {latest.number})"
    number = workflow.current_version + 1
    version = WorkflowVersion.objects.create(
        workflow=workflow,
        number=number,
        definition=raw,
        source=source,
        created_by=user,
        text=text,
    )
    # Drawn once, here: every page and request that shows the version reads this picture.
    WorkflowPicture.objects.create(
        version=version, revision=REVISION, drawing=workflow_picture(raw).to_json()
    )
    workflow.current_version = number
    workflow.save()
    if user is not None:
        # A person's edit (the admin) is in the audit trail, as the definition's changes.
        before, after = changes(
            {"definition": latest.definition} if latest is not None else None,
            {"definition": raw},
        )
        audit_record(
            action=AuditAction.ADMIN_ADD if created else AuditAction.ADMIN_CHANGE,
            actor=f"{source}:{user.get_username()}",
            user_id=user.pk,
            object_type=Workflow._meta.label_lower,
            object_id=workflow.pk,
            object_repr=str(workflow),
            before=before,
            after=after,
            data={"version": number},
        )
    return f"workflow {definition.slug}: {'created' if created else 'updated'} (version {number})"


def _input_check(definition: Definition, value: Any) -> None:
    if not isinstance(value, dict):
        raise InvalidInput(
            "input must be a JSON object", details={"field": "input", "path": "$.input"}
        )
    errors = sorted(
        Draft202012Validator(definition.input_schema).iter_errors(value),
        key=lambda e: list(map(str, e.absolute_path)),
    )
    if errors:
        first = errors[0]
        path = "$.input" + "".join(
            f"[{p}]" if isinstance(p, int) else f".{p}" for p in first.absolute_path
        )
        raise InvalidInput(
            f"{path}: {first.message}",
            details={"field": "input", "path": path, "errors": len(errors)},
        )


def _initial_state(definition: Definition, value: dict[str, Any]) -> dict[str, Any]:
    deadline = time.time() + float(definition.deadline_s) if definition.deadline_s else None
    return RunState.start(definition.start, value, deadline_at=deadline).to_json()


def _earlier_run(owner: User, workflow: Workflow, key: str) -> Session | None:
    message = (
        Message.objects.filter(
            session__owner=owner,
            session__workflow_version__workflow=workflow,
            idempotency_key=key,
            role="user",
        )
        .select_related("session")
        .first()
    )
    return message.session if message is not None else None


def workflow_run_start(
    *,
    owner: User,
    key_roles: list[str],
    slug: str,
    input: Any,
    idempotency_key: str | None = None,
    metadata: dict[str, Any] | None = None,
    webhook: Any = None,
    api_key_id: int | None = None,
) -> tuple[Session, bool]:
    """Start a run of the workflow's current version; (session, created). `api_key_id`: the
    key that started it (a request's, a schedule's), charged with its model calls' cost
    (billing.SpendDaily) and held to its budget, as a session it opens is.

    1. The workflow must exist and be enabled (404), the key must hold its role (403), and
       the input must satisfy its `input` schema (400 `invalid_input`, naming the path), and a
       `webhook` ({url}, called when the run ends) the egress policy (400 naming it).
    2. A repeated idempotency key returns the first run (409 if its input differs); a
       lock on the key serialises two requests that race with it.
    3. In one transaction: the session (the run) with its first state, and the turn-start
       step with the input as its message; a worker is woken after the commit.
    """
    workflow = (
        Workflow.objects.filter(slug=slug, enabled=True, current_version__gt=0)
        .select_related("runtime_agent")
        .first()
    )
    if workflow is None:
        raise NotFound(f"workflow {slug} not found")
    session_role_check(role=workflow.role, key_roles=key_roles)
    version = WorkflowVersion.objects.get(workflow=workflow, number=workflow.current_version)
    definition = version_definition(version.pk)
    _input_check(definition, input)
    url = None if webhook is None else webhook_url_check(webhook, field="webhook")
    content = json.dumps(input, ensure_ascii=False, sort_keys=True)
    with transaction.atomic():
        if idempotency_key:
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT pg_advisory_xact_lock(hashtext(%s))",
                    [f"workflow-run:{owner.pk}:{slug}:{idempotency_key}"],
                )
            earlier = _earlier_run(owner, workflow, idempotency_key)
            if earlier is not None:
                first = Message.objects.filter(session=earlier, role="user").order_by("id").first()
                if first is None or first.content != content:
                    raise Conflict(
                        "idempotency_key was already used with a different input",
                        details={"idempotency_key": idempotency_key},
                        code="idempotency_key_reused",
                    )
                return earlier, False
        agent = workflow.runtime_agent
        session = Session.objects.create(
            agent=agent,
            owner=owner,
            role=workflow.role,
            metadata=metadata or {},
            value=agent.value,
            workflow_version=version,
            workflow_state=_initial_state(definition, input),
            api_key_id=api_key_id,
        )
        message = Message(
            session=session,
            role="user",
            content=content,
            data={"input": input},
            idempotency_key=idempotency_key or None,
            token_count=count_message_tokens(content),
        )
        if url:
            webhook_target_add(session_id=session.pk, url=url)
        turn_start(session=session, lease_owner=None, message=message)
        dispatch.run_enqueue_on_commit(session.pk, session.value)
    return session, True
