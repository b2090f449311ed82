"""After a fork, a resume or a long pause: a note on what changed in the environment the
tools run in, against the one the session's latest checkpoint recorded."""

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone

from engine.gates import Contribution
from engine.model.environment import describe_changes
from memory.tokens import count_message_tokens
from sessions.models import Checkpoint, Message, Session


def environment_note(session: Session, env: dict[str, Any]) -> Contribution:
    """After a fork, a resume or a long pause, say what changed in the environment.

    The reference is the environment recorded by the session's latest
    checkpoint that recorded one (a fork copies its source's).
    """
    # The row's updated_at is the last step's commit: no query to tell a pause.
    paused = session.updated_at is not None and timezone.now() - session.updated_at > timedelta(
        seconds=settings.ENV_CHECK_PAUSE_S
    )
    if not (session.resume_check or paused):
        return Contribution()
    recorded = (
        Checkpoint.objects.filter(session=session, context__has_key="env")
        .order_by("-step")
        .values_list("context", flat=True)
        .first()
    )
    if not recorded:
        return Contribution()
    changes = describe_changes(recorded["env"], env)
    if not changes:
        return Contribution()
    text = (
        "Note from the platform: since this conversation was paused, "
        + "; ".join(changes)
        + ". Take this into account."
    )
    return Contribution.note(
        Message(
            turn=session.turn, role="system", content=text, token_count=count_message_tokens(text)
        )
    )
