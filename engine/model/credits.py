"""Whether the owner's points cover a model call on a paid endpoint, asked before it is
sent: by the model step's gates, a workflow's model node, and the engine's own calls (a
dialogue-state extraction, a memory extraction, a summary made ahead)."""

from django.conf import settings

from billing.pressure import OwnerFigures
from billing.pricing import model_call_points
from billing.selectors import CreditsCheck, credits_cover
from engine.model.calls import endpoint_tokenizer
from llm.types import ChatRequest
from memory.tokens import estimate_request_tokens
from record.models import ModelEndpoint, Session

# The code of a call refused for credit points (a tool's, or one the credit pool refuses).
INSUFFICIENT = "insufficient_credits"
# Kept figures answer without a query while the balance and the cap's room are this many
# times the points asked (closer than that, the account row itself is asked).
FIGURES_NEAR_CREDITS = 2.0


def model_credits_check(
    session: Session,
    endpoint: ModelEndpoint,
    request: ChatRequest,
    output_estimate: int,
    figures: OwnerFigures | None = None,
    points_since: int = 0,
) -> CreditsCheck | None:
    """Before a model call on a paid endpoint: can the owner pay for its estimated tokens?
    None when the endpoint costs no points (no query).

    With the gate's `figures` (read this turn) and the points this run took since that
    read: no query when they show no account (unmetered, or refused if credits are
    required), or a free balance and cap room of FIGURES_NEAR_CREDITS times the points
    and more; anything closer is asked of the account row itself."""
    if not endpoint.credits_per_1k_tokens:
        return None
    tokens = estimate_request_tokens(request, endpoint_tokenizer(endpoint)) + (
        request.max_tokens or output_estimate
    )
    points = model_call_points(tokens=tokens, credits_per_1k_tokens=endpoint.credits_per_1k_tokens)
    if figures is not None and figures.credits is None and not settings.CREDITS_REQUIRED:
        return CreditsCheck("unmetered", points)
    if figures is not None and figures.credits is not None:
        balance, _reserved, cap, spent_today = figures.credits
        balance -= points_since
        room = FIGURES_NEAR_CREDITS * points
        if balance >= room and (cap is None or cap - spent_today - points_since >= room):
            return CreditsCheck("ok", points, balance)
    return credits_cover(owner_id=session.owner_id, points=points)
