"""Named reads of the OpenAI-compatible endpoint: the agents a key may use, a turn's token use."""

from uuid import UUID

from django.db.models import QuerySet

from sessions.errors import NotFound
from sessions.models import Agent, Session
from sessions.selectors import agents_enabled


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
