"""What the edges call: create sessions, post messages, cancel, sweep.

Each function is keyword-only, runs in one short transaction and leaves the
long work (model and tool calls) to a worker, woken after commit.
"""

import logging
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import IntegrityError, connection, transaction
from django.db.models import F

from memory.tokens import count_message_tokens

from .dispatch import run_enqueue, run_enqueue_on_commit
from .engine.runner import RunResult, session_run, turn_cancel, turn_start
from .errors import Conflict, InvalidInput, NotFound, PayloadTooLarge
from .models import Agent, Message, MessageStatus, Session
from .states import RUNNABLE, TURN_ENDED, State

logger = logging.getLogger(__name__)


def session_create(
    *, owner: User, agent_slug: str, key_roles: list[str], role: str | None = None, metadata: dict[str, Any] | None = None
) -> Session:
    """Open a session on an agent; its role is fixed now from what the caller's key allows."""
    agent = Agent.objects.filter(slug=agent_slug, enabled=True).first()
    if agent is None:
        raise InvalidInput(f"unknown agent '{agent_slug}'", details={"field": "agent"}, code="unknown_agent")
    if role:
        if role not in key_roles:
            raise InvalidInput(
                f"role '{role}' is not granted to this API key (granted: {', '.join(key_roles) or 'none'})",
                details={"field": "role"},
            )
    else:
        role = key_roles[0] if key_roles else ""
    return Session.objects.create(agent=agent, owner=owner, role=role, metadata=metadata or {})


@dataclass(frozen=True)
class PostedMessage:
    message: Message
    created: bool


def message_post(*, session: Session, content: str, idempotency_key: str | None = None) -> PostedMessage:
    """Accept a user message durably, then start its turn or queue it behind the running one.

    1. Lock the session row for the length of this short transaction, so
       posts into one session are serialised in arrival order.
    2. A repeated idempotency key returns the first message (409 if the body differs).
    3. Store the message as queued; if no turn is running, start one now.
    4. After commit, wake a worker.
    """
    if not content or not content.strip():
        raise InvalidInput("content must be a non-empty string", details={"field": "content"})
    if len(content) > settings.MAX_MESSAGE_CHARS:
        raise PayloadTooLarge(
            f"content has {len(content)} characters; the limit is {settings.MAX_MESSAGE_CHARS}",
            details={"field": "content", "limit": settings.MAX_MESSAGE_CHARS},
        )
    with transaction.atomic():
        locked = Session.objects.select_for_update().get(pk=session.pk)
        if idempotency_key:
            existing = Message.objects.filter(session=locked, idempotency_key=idempotency_key).first()
            if existing is not None:
                if existing.content != content:
                    raise Conflict(
                        "idempotency_key was already used with a different content",
                        details={"idempotency_key": idempotency_key},
                        code="idempotency_conflict",
                    )
                return PostedMessage(message=existing, created=False)
        try:
            with transaction.atomic():
                message = Message.objects.create(
                    session=locked,
                    role="user",
                    status=MessageStatus.QUEUED,
                    content=content,
                    idempotency_key=idempotency_key or None,
                    token_count=count_message_tokens(content),
                )
        except IntegrityError:
            raise Conflict("idempotency_key was already used", code="idempotency_conflict") from None
        Session.objects.filter(pk=locked.pk).update(queued_count=F("queued_count") + 1)
        locked.queued_count += 1
        if State(locked.state) in TURN_ENDED:
            turn_start(session=locked, lease_owner=None)
        run_enqueue_on_commit(locked.pk)
    message.refresh_from_db()
    return PostedMessage(message=message, created=True)


def session_cancel(*, session: Session, reason: str = "cancelled by the client", actor: str = "") -> bool:
    """Interrupt the current turn; False if there was nothing to interrupt."""
    with transaction.atomic():
        locked = Session.objects.select_for_update().get(pk=session.pk)
        state = State(locked.state)
        if state in RUNNABLE:
            # The worker stops at its next step boundary; if none holds the
            # session, the woken run (or the sweeper) finishes the cancel.
            Session.objects.filter(pk=locked.pk).update(cancel_requested=True)
            run_enqueue_on_commit(locked.pk)
            return True
        if state in TURN_ENDED:
            return False
        turn_cancel(session=locked, reason=reason, actor=actor)
        return True


def session_run_pending(*, session_id: UUID | str) -> RunResult:
    """The worker's entry point: run whatever the session has to do."""
    return session_run(session_id=session_id)


def sessions_sweep() -> list[str]:
    """Requeue runs whose lease ran out, and queued turns nobody is running.

    Claiming a session here pushes its lease expiry one pickup grace ahead, so
    a sweep every second does not enqueue the same session every second.
    """
    runnable = [s.value for s in RUNNABLE]
    ended = [s.value for s in TURN_ENDED]
    with connection.cursor() as cursor:
        cursor.execute(
            f"""UPDATE {Session._meta.db_table}
                   SET lease_owner = NULL, lease_expires_at = now() + make_interval(secs => %s)
                 WHERE (state = ANY(%s) OR (state = ANY(%s) AND queued_count > 0))
                   AND (lease_expires_at IS NULL OR lease_expires_at < now())
             RETURNING id""",
            [settings.SESSION_PICKUP_GRACE_S, runnable, ended],
        )
        ids = [str(row[0]) for row in cursor.fetchall()]
    for session_id in ids:
        logger.info("sweeper: requeueing session %s", session_id)
        run_enqueue(session_id)
    return ids


def session_get(*, session_id: UUID | str) -> Session:
    try:
        return Session.objects.select_related("agent").get(pk=session_id)
    except (Session.DoesNotExist, ValueError, ValidationError):
        # A malformed id (Django raises ValidationError for it) is just as missing.
        raise NotFound(f"session {session_id} not found") from None


class ConfigInvalid(Exception):
    def __init__(self, errors: list[str]) -> None:
        super().__init__("\n".join(errors))
        self.errors = errors


MODEL_FIELDS = (
    "api", "base_url", "model", "api_key_env", "connect_timeout_s", "first_token_timeout_s",
    "total_timeout_s", "price_input_per_1k", "price_output_per_1k", "context_window", "options", "enabled",
)
TOOL_FIELDS = (
    "description", "result_description", "kind", "handler", "url", "method", "headers", "parameters",
    "status_url", "probe_handler", "idempotent",
    "timeout_s", "side_effects", "requires_approval", "risk_level", "roles", "credit_cost", "enabled",
)
AGENT_FIELDS = (
    "name", "system_prompt", "tools", "max_iterations", "context_window", "rules", "busy_message", "enabled",
    "candidate_percent", "repeat_call_limit", "same_result_limit", "step_timeout_s", "turn_timeout_s",
)


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
       handlers); any problem raises ConfigInvalid and nothing is written.
    2. In one transaction, upsert models, then tools, then agents.
    3. Return one line per entry saying what changed.
    """
    from decimal import Decimal

    from accounts.models import Role
    from tools.models import Tool

    from .config_schema import config_errors
    from .models import ModelEndpoint

    errors = config_errors(
        document,
        known_models=set(ModelEndpoint.objects.values_list("name", flat=True)),
        known_tools=set(Tool.objects.values_list("name", flat=True)),
        known_roles=set(Role.objects.values_list("name", flat=True)),
        check_urls=check_urls,
    )
    if errors:
        raise ConfigInvalid(errors)
    report: list[str] = []
    with transaction.atomic():
        for entry in document.get("roles") or []:
            values = {"description": entry.get("description", "")}
            report.append(f"role {entry['name']}: {_upsert(Role, {'name': entry['name']}, values)}")
        for entry in document.get("models") or []:
            values = {k: entry[k] for k in MODEL_FIELDS if k in entry}
            for price in ("price_input_per_1k", "price_output_per_1k"):
                if price in values:
                    values[price] = Decimal(str(values[price]))
            report.append(f"model {entry['name']}: {_upsert(ModelEndpoint, {'name': entry['name']}, values)}")
        for entry in document.get("tools") or []:
            values = {k: entry[k] for k in TOOL_FIELDS if k in entry}
            values.setdefault("parameters", {"type": "object", "properties": {}})
            report.append(f"tool {entry['name']}: {_upsert(Tool, {'name': entry['name']}, values)}")
        for entry in document.get("agents") or []:
            values = {k: entry[k] for k in AGENT_FIELDS if k in entry}
            values["model"] = ModelEndpoint.objects.get(name=entry["model"])
            fallback = entry.get("fallback_model")
            values["fallback_model"] = ModelEndpoint.objects.get(name=fallback) if fallback else None
            candidate = entry.get("candidate_model")
            values["candidate_model"] = ModelEndpoint.objects.get(name=candidate) if candidate else None
            report.append(f"agent {entry['slug']}: {_upsert(Agent, {'slug': entry['slug']}, values)}")
    return report
