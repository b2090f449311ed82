"""Named reads of sessions, their history and their events."""

from uuid import UUID

from django.core.exceptions import ValidationError
from django.db.models import F, QuerySet

from .errors import NotFound
from .models import Agent, Checkpoint, Event, Message, Session


def session_get_for_owner(*, session_id: UUID | str, owner_id: int) -> Session:
    """Another owner's session is reported as missing, not forbidden."""
    try:
        return Session.objects.select_related("agent").get(pk=session_id, owner_id=owner_id)
    except (Session.DoesNotExist, ValueError, TypeError, ValidationError):
        raise NotFound(f"session {session_id} not found") from None


def session_list_for_owner(*, owner_id: int) -> QuerySet[Session]:
    return Session.objects.select_related("agent").filter(owner_id=owner_id).order_by("-created_at")


def message_history(*, session: Session, limit: int) -> list[Message]:
    """The last `limit` messages, oldest first; messages waiting for their turn come last."""
    rows = list(
        Message.objects.filter(session=session).order_by(F("seq").desc(nulls_first=True), "-id")[
            :limit
        ]
    )
    rows.reverse()
    return rows


def events_after(*, session_id: UUID | str, after: int, limit: int = 1000) -> list[Event]:
    return list(Event.objects.filter(session_id=session_id, seq__gt=after).order_by("seq")[:limit])


def checkpoints_of(*, session: Session, limit: int) -> list[Checkpoint]:
    return list(Checkpoint.objects.filter(session=session).order_by("-step")[:limit])


def agents_enabled() -> QuerySet[Agent]:
    """The agents a key may open sessions on (every enabled one; tools are gated by role)."""
    return Agent.objects.filter(enabled=True).order_by("slug")
