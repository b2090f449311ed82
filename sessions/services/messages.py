"""Opening sessions and posting messages: the role and value a key may use, the checks on
what a message carries, and the queue, double texting and the run it wakes.
"""

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import F

from engine import (
    INTERRUPT_REASON,
    open_client_calls,
    open_question,
    turn_start,
    user_answer,
)
from hooks.outbox import webhook_target_add, webhook_url_check
from llm.types import ModelOptions
from memory.tokens import count_message_tokens
from record import dispatch
from record.errors import Conflict, InvalidInput, NotFound, PayloadTooLarge
from record.json_limits import JsonRejected, json_check
from record.models import (
    Agent,
    DoubleTexting,
    Message,
    MessageStatus,
    Session,
)
from record.states import STARTS_TURN, State
from runtime.fastpaths.prepared import PreparedQuery
from sessions.selectors import session_id_parse
from sessions.services.grants import session_role_check, session_value_check
from sessions.services.runs import turn_interrupt

logger = logging.getLogger(__name__)


def session_create(
    *,
    owner: User,
    agent_slug: str,
    key_roles: list[str],
    role: str | None = None,
    metadata: dict[str, Any] | None = None,
    value: float | None = None,
    value_max: float | None = None,
    ephemeral: bool = False,
    api_key_id: int | None = None,
    webhook: Any = None,
) -> Session:
    """Open a session on an agent; its role is fixed now from what the caller's key allows,
    its value (priority for credits and workers) from the caller, within what the key is
    granted (`value_max`, see `session_value_check`), or else the agent's. An `ephemeral`
    one (a stateless OpenAI-compatible request) is pruned once idle for a while. The
    `api_key_id` that opened it is charged with its model calls' cost (billing.SpendDaily).
    A `webhook` ({url}, egress-checked: 400 naming it) is called when each of its turns ends."""
    # A workflow's runtime agent runs that workflow's runs only.
    agent = Agent.objects.filter(slug=agent_slug, enabled=True, workflow__isnull=True).first()
    if agent is None:
        raise InvalidInput(
            f"unknown agent '{agent_slug}'", details={"field": "agent"}, code="unknown_agent"
        )
    if role:
        if role not in key_roles:
            raise InvalidInput(
                f"role '{role}' is not granted to this API key (granted: {', '.join(key_roles) or 'none'})",
                details={"field": "role"},
            )
    else:
        role = key_roles[0] if key_roles else ""
    if value is not None:
        session_value_check(value=value, agent_value=agent.value, value_max=value_max)
    url = None if webhook is None else webhook_url_check(webhook, field="webhook")
    with transaction.atomic():
        session = Session.objects.create(
            agent=agent,
            owner=owner,
            role=role,
            metadata=metadata or {},
            value=agent.value if value is None else value,
            ephemeral=ephemeral,
            api_key_id=api_key_id,
        )
        if url:
            webhook_target_add(session_id=session.pk, url=url)
    return session


@dataclass(frozen=True)
class PostedMessage:
    message: Message
    created: bool


def message_post(
    *,
    session: Session,
    content: str,
    idempotency_key: str | None = None,
    extra_context: dict[str, Any] | None = None,
    turn_options: ModelOptions | None = None,
) -> PostedMessage:
    """Accept a user message durably, then start its turn or deal with the running one.

    1. Lock the session row for the length of this short transaction, so
       posts into one session are serialised in arrival order.
    2. A repeated idempotency key returns the first message (409 if the body differs).
    3. While a turn runs, the agent's double-texting policy decides: `enqueue`
       (wait for the turn, in order), `interrupt` (stop the turn at its next
       step boundary, then run this one) or `reject` (409).
    4. Store the message (with its `extra_context`, data for the model, and its
       `turn_options`, the client's settings for the turn's model calls) as queued; if
       no turn is running, start one now.
    5. After commit, wake a worker (and, on interrupt, close a running stream).
    """
    _content_check(content)
    extra_context_check(extra_context)
    pk = session_id_parse(session.pk)
    with transaction.atomic():
        locked = None if pk is None else _session_locked.first(pk)
        if locked is None:
            raise Session.DoesNotExist(f"session {session.pk} is gone")
        return _message_accept(
            locked,
            content=content,
            idempotency_key=idempotency_key,
            extra_context=extra_context,
            turn_options=turn_options,
        )


def message_post_for_owner(
    *,
    session_id: UUID | str,
    owner_id: int,
    key_roles: Sequence[str],
    content: str,
    idempotency_key: str | None = None,
    extra_context: dict[str, Any] | None = None,
    turn_options: ModelOptions | None = None,
    webhook: Any = None,
) -> PostedMessage:
    """`message_post` for an API caller: the session is looked up and locked in one
    statement, and another owner's session is missing (NotFound), as in
    `selectors.session_get_for_owner`. A missing session is reported before
    anything wrong with the content, as when the two were checked apart; a key
    without the session's role (`session_role_check`) is refused before that."""
    pk = session_id_parse(session_id)
    with transaction.atomic():
        locked = None if pk is None else _session_of_owner_locked.first(pk, owner_id)
        if locked is None:
            raise NotFound(f"session {session_id} not found")
        session_role_check(role=locked.role, key_roles=key_roles)
        _content_check(content)
        extra_context_check(extra_context)
        url = None if webhook is None else webhook_url_check(webhook, field="webhook")
        posted = _message_accept(
            locked,
            content=content,
            idempotency_key=idempotency_key,
            extra_context=extra_context,
            turn_options=turn_options,
        )
        if url and posted.created:
            # This message's turn only (hooks/outbox.py).
            webhook_target_add(session_id=locked.pk, url=url, message=posted.message)
        return posted


# Every posted message (REST, websocket): compiled once (runtime/fastpaths/prepared.py).
_session_locked: PreparedQuery[Session] = PreparedQuery(
    lambda pk: Session.objects.locked().select_related("agent").filter(pk=pk), example=[UUID(int=0)]
)
_session_of_owner_locked: PreparedQuery[Session] = PreparedQuery(
    lambda pk, owner_id: (
        Session.objects.locked().select_related("agent").filter(pk=pk, owner_id=owner_id)
    ),
    example=[UUID(int=0), 0],
)


def _content_check(content: str) -> None:
    if not content or not content.strip():
        raise InvalidInput("content must be a non-empty string", details={"field": "content"})
    if len(content) > settings.MAX_MESSAGE_CHARS:
        raise PayloadTooLarge(
            f"content has {len(content)} characters; the limit is {settings.MAX_MESSAGE_CHARS}",
            details={"field": "content", "limit": settings.MAX_MESSAGE_CHARS},
        )


def extra_context_check(extra_context: Any) -> None:
    """A message's `extra_context` is a JSON object within EXTRA_CONTEXT_MAX_DEPTH and
    EXTRA_CONTEXT_MAX_BYTES (as compact UTF-8 JSON), or absent (None)."""
    if extra_context is None:
        return
    if not isinstance(extra_context, dict):
        raise InvalidInput(
            f"extra_context must be a JSON object, not {_json_type(extra_context)}",
            details={"field": "extra_context"},
        )
    limit = settings.EXTRA_CONTEXT_MAX_BYTES
    try:
        json_check(
            extra_context,
            root="$.extra_context",
            max_depth=settings.EXTRA_CONTEXT_MAX_DEPTH,
            max_bytes=limit,
        )
    except JsonRejected as exc:
        if exc.too_large:  # too big is a 413, as for content and metadata
            raise PayloadTooLarge(
                f"extra_context: {exc.reason}", details={"field": "extra_context", "limit": limit}
            ) from None
        raise InvalidInput(
            f"extra_context: {exc.message}", details={"field": "extra_context", **exc.details}
        ) from None


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return type(value).__name__


def _message_accept(
    locked: Session,
    *,
    content: str,
    idempotency_key: str | None,
    extra_context: dict[str, Any] | None = None,
    turn_options: ModelOptions | None = None,
) -> PostedMessage:
    """message_post's steps 2-5, inside its transaction, with the session row locked."""
    if locked.workflow_version_id is not None:
        raise Conflict(
            "this session is a workflow run: it takes its input when it starts, not messages",
            details={"session": str(locked.pk)},
            code="not_a_conversation",
        )
    if idempotency_key:
        existing = Message.objects.filter(session=locked, idempotency_key=idempotency_key).first()
        if existing is not None:
            if existing.content != content or existing.extra_context != extra_context:
                raise Conflict(
                    "idempotency_key was already used with a different content or extra_context",
                    details={"idempotency_key": idempotency_key},
                    code="idempotency_key_reused",
                )
            return PostedMessage(message=existing, created=False)
    state = State(locked.state)
    question = open_question(locked) if state == State.PAUSED_FOR_USER else None
    if question is None and state == State.PAUSED_FOR_USER and open_client_calls(locked):
        # The turn waits for the results of the client's own tools (the OpenAI-compatible
        # endpoint's tool messages bring them); a message is no answer to them.
        raise Conflict(
            "the turn waits for the results of the client's tool calls; send them with the "
            "OpenAI-compatible endpoint, or cancel the turn",
            details={"state": state.value},
            code="client_tools_pending",
        )
    if question is not None:
        # The answer to the model's ask_user: that call's result; the same turn goes on.
        answer = user_answer(
            session=locked,
            call=question,
            answer=content,
            by="user",
            extra_context=extra_context,
            turn_options=turn_options,
        )
        if idempotency_key:
            Message.objects.filter(pk=answer.pk).update(idempotency_key=idempotency_key)
        dispatch.run_enqueue_on_commit(locked.pk, locked.value)
        return PostedMessage(message=answer, created=True)
    busy = state not in STARTS_TURN
    policy = locked.agent.double_texting
    if busy and policy == DoubleTexting.REJECT:
        raise Conflict(
            "a turn is still running and this agent does not accept messages until it finishes",
            details={"state": state.value, "policy": policy},
            code="turn_in_progress",
        )
    message = Message(
        session=locked,
        role="user",
        content=content,
        idempotency_key=idempotency_key or None,
        token_count=count_message_tokens(content),
        extra_context=extra_context,
        turn_options=turn_options,
    )
    if not busy and locked.queued_count == 0:
        # The common case: straight into the history, in the turn-start step itself.
        message.status = MessageStatus.FINAL
        turn_start(session=locked, lease_owner=None, message=message)
    else:
        # The row lock serialises posts and the key was checked above, so
        # the insert cannot conflict.
        message.status = MessageStatus.QUEUED
        message.save(force_insert=True)
        Session.objects.filter(pk=locked.pk).update(queued_count=F("queued_count") + 1)
        locked.queued_count += 1
        if not busy:
            turn_start(session=locked, lease_owner=None)
        elif policy == DoubleTexting.INTERRUPT:
            turn_interrupt(locked, reason=INTERRUPT_REASON, actor="")
            if State(locked.state) in STARTS_TURN:
                turn_start(session=locked, lease_owner=None)
    dispatch.run_enqueue_on_commit(locked.pk, locked.value)
    return PostedMessage(message=message, created=True)


def session_get(*, session_id: UUID | str) -> Session:
    try:
        return Session.objects.select_related("agent").get(pk=session_id)
    except (Session.DoesNotExist, ValueError, ValidationError):
        # A malformed id (Django raises ValidationError for it) is just as missing.
        raise NotFound(f"session {session_id} not found") from None
