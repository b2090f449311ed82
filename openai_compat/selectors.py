"""Named reads of the OpenAI-compatible endpoint: the agents a key may use, a turn's token
use, what a failed turn's model calls said."""

import time
from uuid import UUID

from django.db.models import QuerySet

from record.errors import NotFound
from record.events import EventType
from record.models import (
    Agent,
    Event,
    ModelCall,
    RequestKey,
    Session,
    ToolCall,
    ToolCallStatus,
)
from runtime.breaker import model_breaker
from sessions.selectors import agents_enabled

from .turns import FailureFacts


def agents_for_key() -> QuerySet[Agent]:
    """The agents any key may open a session on: the enabled ones (as `POST /api/v1/sessions/`
    accepts them; a key's roles decide which of an agent's tools it gets, not the agent)."""
    return agents_enabled()


def agent_for_model(*, model: str) -> Agent:
    """The enabled agent whose slug is `model`; NotFound (code model_not_found) otherwise."""
    # A NUL cannot be in a slug, and PostgreSQL refuses it in a query parameter.
    agent = None if "\x00" in model else agents_enabled().filter(slug=model).first()
    if agent is None:
        raise NotFound(f"The model '{model}' does not exist", code="model_not_found")
    return agent


def session_tokens(*, session_id: UUID | str) -> tuple[int, int]:
    """The session's running (input, output) token totals."""
    row = Session.objects.filter(pk=session_id).values_list("input_tokens", "output_tokens").first()
    return (int(row[0]), int(row[1])) if row else (0, 0)


def turn_failure_facts(*, session_id: UUID | str, turn: int | None) -> FailureFacts:
    """The session's last_error and the outcomes of the turn's last step's model calls, with
    how long the breakers of the rate-limited endpoints stay open (a 503's Retry-After), and
    whether a side-effecting tool call of the turn was sent."""
    last_error = Session.objects.filter(pk=session_id).values_list("last_error", flat=True).first()
    rows = (
        list(
            ModelCall.objects.filter(session_id=session_id, turn=turn, purpose="step")
            .order_by("-step", "-id")
            .values_list("step", "outcome", "endpoint_name")[:8]
        )
        if turn is not None
        else []
    )
    last_step = [row for row in rows if row[0] == rows[0][0]] if rows else []
    last_step.reverse()
    limited = {name for _, outcome, name in last_step if outcome == "rate_limited"}
    now = time.time()
    waits = [model_breaker().state(name).open_until - now for name in sorted(limited)]
    waits = [w for w in waits if w > 0]
    side_effects = (
        turn is not None
        and ToolCall.objects.filter(
            session_id=session_id, turn=turn, dispatched_at__isnull=False
        ).exists()
    )
    return FailureFacts(
        side_effects=side_effects,
        last_error=last_error or "",
        outcomes=tuple(outcome for _, outcome, _ in last_step),
        retry_after_s=min(waits) if waits else None,
    )


def session_waiting_for(*, owner_id: int, call_ids: list[str]) -> UUID | None:
    """The owner's session whose turn waits for the client's results of these calls: how a
    client that sends no X-Session-Id (LangChain, the Agents SDK) goes on with its turn.
    None when no session, or more than one, has them open."""
    found = list(
        ToolCall.objects.filter(
            client=True,
            status=ToolCallStatus.EXECUTING,
            call_id__in=call_ids,
            session__owner_id=owner_id,
        )
        .values_list("session_id", flat=True)
        .distinct()[:2]
    )
    return found[0] if len(found) == 1 else None


def turn_left_running(
    *, record_id: int, attempt: int, session_id: UUID | str, after_seq: int
) -> bool:
    """Whether the turn a keyed request left (posted after `after_seq`) still runs with nobody
    waiting for it: no later request with the key (a retry) re-attached since the request
    claimed it, and the turn has not ended (a later turn of the session is not its to cancel)."""
    if not RequestKey.objects.filter(
        pk=record_id, attempts=attempt, session_id=session_id
    ).exists():
        return False
    return not Event.objects.filter(
        session_id=session_id, seq__gt=after_seq, type="turn.finished"
    ).exists()


def session_agent_chain(*, session: Session) -> set[str]:
    """The agents of the session's handoff chain: the one it runs now and every one a
    handoff (`agent.changed`) came from or went to. A request naming any of them goes on
    with the session (the agent it runs now answers)."""
    chain = {session.agent.slug}
    for data in Event.objects.filter(session=session, type=EventType.AGENT_CHANGED).values_list(
        "data", flat=True
    ):
        if isinstance(data, dict):
            chain |= {str(data.get("from") or ""), str(data.get("to") or "")} - {""}
    return chain
