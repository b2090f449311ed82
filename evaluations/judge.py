"""An optional judge: a model the operator names scores the candidate's answer against the
recorded one with the operator's rubric, 0 to 1. Its call is an evaluation's own (not a
session's): it is not metered as anyone's usage."""

import json
import logging
import re

from llm.base import EndpointConfig, ModelError, adapter_for
from llm.types import ChatMessage, ChatRequest
from record.models import ModelEndpoint
from runtime import io_loop

from .scoring import Side

logger = logging.getLogger(__name__)

_INSTRUCTIONS = (
    "You compare two answers to the same user message: the recorded BASELINE and a "
    "CANDIDATE. Score the candidate from 0 (useless or wrong) to 1 (as good as or better "
    "than the baseline) by this rubric:\n{rubric}\n"
    'Reply with JSON only: {{"score": <number 0..1>, "reason": "<one sentence>"}}'
)
_NUMBER = re.compile(r'"score"\s*:\s*([0-9.]+)')


def judge_turn(
    judge: dict[str, str], *, opening: str, baseline: Side, candidate: Side
) -> float | None:
    """The judge's score, or None when it could not give one (its error is logged)."""
    endpoint = ModelEndpoint.objects.filter(name=judge["model"], enabled=True).first()
    if endpoint is None:
        return None
    config = EndpointConfig(
        name=endpoint.name,
        api=endpoint.api,
        base_url=endpoint.base_url,
        model=endpoint.model,
        api_key_env=endpoint.api_key_env,
        connect_timeout_s=endpoint.connect_timeout_s,
        first_token_timeout_s=endpoint.first_token_timeout_s,
        total_timeout_s=endpoint.total_timeout_s,
        options=dict(endpoint.options or {}),
    )
    request = ChatRequest(
        messages=(
            ChatMessage(role="system", content=_INSTRUCTIONS.format(rubric=judge["rubric"])),
            ChatMessage(
                role="user",
                content=f"USER MESSAGE:\n{opening}\n\nBASELINE:\n{baseline['answer']}\n\n"
                f"CANDIDATE:\n{candidate['answer']}",
            ),
        ),
        temperature=0.0,
    )
    try:
        response = io_loop.run(adapter_for(config).complete(request))
    except ModelError as exc:
        logger.warning(
            "evaluation judge failed: model=%s error=%s", endpoint.name, type(exc).__name__
        )
        return None
    return judge_score_parse(response.text)


def judge_score_parse(text: str) -> float | None:
    try:
        value = json.loads(text).get("score")
    except (ValueError, AttributeError):
        found = _NUMBER.search(text)
        value = found.group(1) if found else None
    try:
        score = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return max(0.0, min(1.0, score))
