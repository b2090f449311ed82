"""Writes of the OpenAI-compatible endpoint: open a session seeded with a request's history,
post a request's input as one turn, or the client's results of its own tools' calls to
the turn that waits for them. Each is one short transaction; the turn runs on a worker."""

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from uuid import UUID

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction

from engine import agent_tool_names, client_results, handoff_barred, open_client_calls
from llm.types import ClientToolJson, ModelOptions
from llm.wire_names import wire_name
from memory.tokens import count_message_tokens
from record import dispatch
from record.errors import DomainError, InvalidInput, NotFound, PayloadTooLarge
from record.events import StopReason
from record.models import Agent, Event, Message, MessageStatus, Session, ToolCall
from record.states import STARTS_TURN, State
from sessions.selectors import session_id_parse
from sessions.services import (
    KeyedRequest,
    message_post_for_owner,
    request_key_find,
    request_key_save,
    session_create,
    session_role_check,
)

from .wire import HistoryItem, ToolResult


class SessionBusy(DomainError):
    """The session's turn is still running (or waits for an approval or a timer)."""

    code = "session_busy"
    status = 503


class CreditsExhausted(DomainError):
    """The owner's credits cannot pay for a model call."""

    code = "insufficient_quota"
    status = 429


@dataclass(frozen=True)
class TurnPosted:
    session_id: UUID
    # The session's last event before this turn: the turn's events come after it.
    after_seq: int
    # The session's (input, output) token totals before this turn.
    tokens_before: tuple[int, int]


def chat_session_create(
    *,
    owner: User,
    key_roles: list[str],
    agent_slug: str,
    history: Sequence[HistoryItem],
    content: str,
    ephemeral: bool = False,
    api_key_id: int | None = None,
) -> Session:
    """A new session on the agent whose history is `history` (earlier user and assistant
    messages, in order, as turn 0); no turn starts until `chat_turn_post`. The turn's
    `content` is checked now, so a request refused for it leaves no session behind."""
    if len(content) > settings.MAX_MESSAGE_CHARS:
        raise PayloadTooLarge(
            f"the last message has {len(content)} characters; "
            f"the limit is {settings.MAX_MESSAGE_CHARS}",
            details={"field": "messages", "limit": settings.MAX_MESSAGE_CHARS},
        )
    for i, item in enumerate(history):
        if len(item.content) > settings.MAX_MESSAGE_CHARS:
            raise PayloadTooLarge(
                f"message {i} has {len(item.content)} characters; "
                f"the limit is {settings.MAX_MESSAGE_CHARS}",
                details={"field": f"messages[{i}]", "limit": settings.MAX_MESSAGE_CHARS},
            )
    with transaction.atomic():
        session = session_create(
            owner=owner,
            agent_slug=agent_slug,
            key_roles=key_roles,
            ephemeral=ephemeral,
            api_key_id=api_key_id,
        )
        if history:
            Message.objects.bulk_create(
                Message(
                    session=session,
                    seq=seq,
                    turn=0,
                    role=item.role,
                    status=MessageStatus.FINAL,
                    content=item.content,
                    token_count=count_message_tokens(item.content),
                )
                for seq, item in enumerate(history, start=1)
            )
            Session.objects.filter(pk=session.pk).update(message_seq=len(history))
            session.message_seq = len(history)
    return session


def chat_turn_post(
    *,
    session_id: UUID | str,
    owner_id: int,
    key_roles: Sequence[str],
    content: str,
    options: ModelOptions | None = None,
) -> TurnPosted:
    """Post `content` as the next turn of the owner's session, or refuse while one runs.

    1. Lock the session row (another owner's session is NotFound); a key without the
       session's role is refused (403 `role_not_held`), busy or not.
    2. A turn running, waiting for an approval or a timer, or user messages queued
       behind it: SessionBusy (this request would wait on someone else's turn).
       A session paused on the model's question takes the content as the answer.
    3. Note where the session's events and token totals stand, then post
       (`message_post_for_owner`, the same rules as REST) in the same transaction,
       so no event of another step falls between the two. The request's `options`
       (sampling, response_format) are stored with the message: every step of the
       turn reads them there, after a worker crash too.
    """
    with transaction.atomic():
        locked = _owned_locked(session_id, owner_id, key_roles)
        state = State(locked.state)
        if state not in STARTS_TURN or locked.queued_count:
            raise SessionBusy(
                f"session {locked.pk} is busy ({state.value}); retry when its turn has ended",
                details={"state": state.value},
            )
        posted = TurnPosted(
            session_id=locked.pk,
            after_seq=locked.event_seq,
            tokens_before=(locked.input_tokens, locked.output_tokens),
        )
        message_post_for_owner(
            session_id=locked.pk,
            owner_id=owner_id,
            key_roles=key_roles,
            content=content,
            turn_options=options or None,
        )
    return posted


def _owned_locked(session_id: UUID | str, owner_id: int, key_roles: Sequence[str]) -> Session:
    """The owner's session, its row locked to the end of the caller's transaction (another
    owner's is NotFound); a key without the session's role is refused (403)."""
    pk = session_id_parse(session_id)
    locked = (
        None if pk is None else Session.objects.locked().filter(pk=pk, owner_id=owner_id).first()
    )
    if locked is None:
        raise NotFound(f"session {session_id} not found", code="session_not_found")
    session_role_check(role=locked.role, key_roles=key_roles)
    return locked


def client_tools_check(
    *, agent_id: int, tools: Sequence[ClientToolJson], tool_choice: str | None = None
) -> str | None:
    """The client's own tools may not take the name of one of the agent's (as configured,
    or as the wire spells it): a call must say whose it is. A `tool_choice` naming a tool
    must name one of them or one of the agent's; returned as the engine names it (an
    agent's tool named as the wire spells it, `agent_researcher`, is `agent.researcher`)."""
    agents = agent_tool_names(agent_id)
    spelled = {wire_name(name): name for name in agents}
    taken = agents | set(spelled)
    for i, tool in enumerate(tools):
        if tool["name"] in taken:
            raise InvalidInput(
                f"the tool '{tool['name']}' is one of the agent's own: give yours another name",
                details={"field": f"tools[{i}].function.name"},
                code="invalid_request",
            )
    if tool_choice is None or tool_choice in ("none", "auto", "required"):
        return tool_choice
    if tool_choice in agents or any(t["name"] == tool_choice for t in tools):
        return tool_choice
    if tool_choice in spelled:
        return spelled[tool_choice]
    raise InvalidInput(
        f"tool_choice names '{tool_choice}', which is neither one of the request's tools nor "
        "one of the agent's",
        details={"field": "tool_choice.function.name"},
        code="invalid_request",
    )


def chat_tool_results_post(
    *,
    session_id: UUID | str,
    owner_id: int,
    key_roles: Sequence[str],
    results: Sequence[ToolResult],
    options: ModelOptions | None = None,
    handoff_to: str = "",
) -> TurnPosted:
    """The client's results of its own tools' calls: the turn that made them goes on;
    `handoff_to` (an agent's slug): the client sent them to that agent (its own handoff,
    as the Agents SDK makes one between two platform agents), which answers from now on.

    1. Lock the owner's session (NotFound); a key without its role is refused (403).
    2. Its turn must wait for the client's calls: one still running is busy (503); a
       session whose turn waits for nothing of the client's is a 400.
    3. The results answer exactly the open calls, each once (400 naming the missing or
       unknown tool_call_id).
    4. Note where the events and token totals stand, write the results (the engine's
       `client_results`: the same turn goes on, with the request's `options`), and
       wake a worker once committed.
    """
    with transaction.atomic():
        locked = _owned_locked(session_id, owner_id, key_roles)
        state = State(locked.state)
        waiting = open_client_calls(locked) if state == State.PAUSED_FOR_USER else []
        if not waiting and state not in STARTS_TURN:
            raise SessionBusy(
                f"session {locked.pk} is busy ({state.value}); retry when its turn has ended",
                details={"state": state.value},
            )
        if not waiting:
            raise InvalidInput(
                f"no turn of session {locked.pk} waits for tool results",
                details={"field": "messages"},
                code="invalid_request",
            )
        given = {r.call_id: r.content for r in results}
        missing = [c.call_id for c in waiting if c.call_id not in given]
        unknown = sorted(set(given) - {c.call_id for c in waiting})
        if missing or unknown:
            said = f"missing: {', '.join(missing)}" if missing else f"unknown: {', '.join(unknown)}"
            raise InvalidInput(
                f"the tool messages must answer the turn's open calls, each once ({said})",
                details={"field": "messages"},
                code="invalid_request",
            )
        successor = _handoff_target(locked, handoff_to) if handoff_to else None
        posted = TurnPosted(
            session_id=locked.pk,
            after_seq=locked.event_seq,
            tokens_before=(locked.input_tokens, locked.output_tokens),
        )
        client_results(
            session=locked,
            calls=waiting,
            results=given,
            by="client",
            turn_options=options or None,
            handoff_to=successor,
        )
        dispatch.run_enqueue_on_commit(locked.pk, locked.value)
    return posted


def _handoff_target(session: Session, slug: str) -> Agent:
    """The agent a client hands `session` to: an enabled agent (not a workflow's) whose
    tools the session's role may use (engine/gates/handoff.handoff_barred), else 400."""
    agent = Agent.objects.filter(slug=slug, enabled=True, workflow__isnull=True).first()
    barred = (
        f"no agent '{slug}' to hand over to" if agent is None else handoff_barred(session, agent)
    )
    if barred or agent is None:
        raise InvalidInput(barred, details={"field": "model"}, code="invalid_request")
    return agent


# How a turn may end that a retry of its request runs again (when it sent no side effect):
# no model answered, an answer not valid for response_format, an error inside the platform,
# or the turn cancelled (its client went away and no retry came in time).
RETRY_RUNS_AGAIN = frozenset(
    {
        StopReason.MODEL_UNAVAILABLE,
        StopReason.INVALID_OUTPUT,
        StopReason.ERROR,
        StopReason.CANCELLED,
        StopReason.INTERRUPTED,
    }
)


@dataclass(frozen=True)
class ChatClaim:
    """A keyed request's turn: the one it posted, or its first request's (re-attached)."""

    posted: TurnPosted
    record_id: int
    # The record's request count when this one claimed it: a later request (a retry) makes
    # it larger, and a request gone before its turn ended cancels the turn only if not.
    attempt: int
    reattached: bool


def chat_request_claim(
    *, owner_id: int, keyed: KeyedRequest, start: Callable[[], TurnPosted]
) -> ChatClaim:
    """A request with a key (the client's `Idempotency-Key`, or the one derived for a client
    library's own retries): the turn of its first request, or `start()` posts one.

    Under the key's lock, in one transaction with what `start()` writes:
    1. the same key with another request is a 409 `idempotency_key_reused`;
    2. the first request's turn, running or paused, or ended with an answer, a refusal, or
       after a side effect ran: re-attached (the retry answers what the first would have);
    3. none, its session gone, or a turn that failed in a way a retry may cure without a
       side effect sent (`RETRY_RUNS_AGAIN`): `start()` posts a new turn, and the record
       points at it.
    """
    with transaction.atomic():
        record = request_key_find(owner_id=owner_id, keyed=keyed)
        if (
            record is not None
            and record.session_id is not None
            and _turn_stands(record.session_id, record.after_seq)
        ):
            return ChatClaim(
                posted=TurnPosted(
                    session_id=record.session_id,
                    after_seq=record.after_seq,
                    tokens_before=(record.input_tokens, record.output_tokens),
                ),
                record_id=record.pk,
                attempt=record.attempts,
                reattached=True,
            )
        posted = start()
        record = request_key_save(
            owner_id=owner_id,
            keyed=keyed,
            session_id=posted.session_id,
            after_seq=posted.after_seq,
            input_tokens=posted.tokens_before[0],
            output_tokens=posted.tokens_before[1],
        )
    return ChatClaim(posted=posted, record_id=record.pk, attempt=1, reattached=False)


def _turn_stands(session_id: UUID, after_seq: int) -> bool:
    """Whether a retry answers from the turn posted after `after_seq` rather than running a
    new one."""
    if not Session.objects.filter(pk=session_id).exists():
        return False  # pruned: nothing to re-attach to
    finished = (
        Event.objects.filter(session_id=session_id, seq__gt=after_seq, type="turn.finished")
        .order_by("seq")
        .values_list("data", flat=True)
        .first()
    )
    if finished is None:
        return True  # still running, or paused: the retry waits for it as the first did
    stop = str(finished.get("stop_reason") or "")
    if stop not in RETRY_RUNS_AGAIN:
        return True
    return ToolCall.objects.filter(
        session_id=session_id, turn=finished.get("turn"), dispatched_at__isnull=False
    ).exists()
