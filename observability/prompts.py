"""Sampling full prompts and answers into PromptSample (models.py)."""

import dataclasses
import logging
import random
from typing import Any

from django.conf import settings

from llm.types import ChatRequest, ChatResponse

from . import metrics
from .models import PromptSample

logger = logging.getLogger(__name__)


def sampled() -> bool:
    """Is this model call one of the sampled ones? (No write, no cost, for the others.)"""
    rate = settings.PROMPT_SAMPLE_RATE
    return rate > 0 and (rate >= 1 or random.random() < rate)  # nosec B311 - sampling, not security


def prompt_sample_record(
    *,
    session_id: Any,
    owner_id: int | None,
    turn: int,
    iteration: int,
    endpoint: str,
    model: str,
    trace_id: str,
    request: ChatRequest,
    response: ChatResponse,
    input_tokens: int,
    output_tokens: int,
) -> None:
    """Store one call in full, as the session's owner's (their tenant's staff may list it).
    A failure is logged and forgotten: a sample never fails a step."""
    try:
        body = dataclasses.asdict(request)
        body.pop("agent_config", None)  # configuration, not the prompt
        PromptSample.objects.create(
            session_id=session_id,
            owner_id=owner_id,
            turn=turn,
            iteration=iteration,
            endpoint=endpoint[:100],
            model=model[:200],
            trace_id=trace_id,
            request=_jsonable(body),
            response=_jsonable(dataclasses.asdict(response)),
            input_tokens=input_tokens,
            output_tokens=output_tokens,
        )
        metrics.PROMPT_SAMPLES.inc()
    except Exception:  # noqa: BLE001
        logger.warning("could not store a prompt sample", exc_info=True)


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)
