"""Choosing the model for a step and surviving its failures.

Order of attempts: the agent's model (or its rollout candidate, sticky per
session), retried as its endpoint's retry policy says (`ModelEndpoint.retry`, one
attempt by default), then the agent's fallback model (under its own policy); if both fail,
the caller answers with the agent's "service busy" message. Endpoints whose
breaker is open are skipped without a call. The assembler
(engine/model/context.py) fits every request to the tightest window of the
endpoints a step may call; a request that still cannot fit an endpoint's
window (a system prompt larger than it) is refused here before it is sent, the
last line of defence.
"""

import asyncio
import concurrent.futures
import contextlib
import hashlib
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Literal

from django.conf import settings
from django.db import connection

from billing.pricing import model_call_cost
from engine.model.deltas import DeltaBatcher
from llm import EndpointConfig, adapter_for
from llm.base import (
    ModelCircuitOpen,
    ModelError,
    ModelKeyMissing,
    ModelProtocolError,
    ModelRateLimited,
    ModelRequestTooLarge,
    ModelTimeout,
    ModelUnavailable,
)
from llm.http import RETRY_AFTER_CAP_S, redact
from llm.types import ChatRequest, ChatResponse, StreamEvent
from memory.tokens import (
    Tokenizer,
    estimate_request_tokens,
    estimate_response_tokens,
    tokenizer_for,
    tokenizer_strictest,
)
from observability import metrics, tracing
from observability.redaction import scrub
from record.events import EventType, Progress
from record.models import Agent, ModelCall, ModelEndpoint, Session
from record.publisher import publish_ephemeral
from runtime import health, io_loop
from runtime.breaker import model_breaker
from runtime.cancellation import cancel_watch
from runtime.faults import fault_point
from runtime.retry import MODEL_DEFAULT, retry_policy

logger = logging.getLogger(__name__)


def rollout_bucket(session_id: object) -> int:
    """0-99, stable for a session, so it keeps its model for its whole life."""
    return int(hashlib.sha256(str(session_id).encode()).hexdigest()[:8], 16) % 100


def primary_endpoint(agent: Agent, session: Session) -> tuple[ModelEndpoint, bool]:
    candidate = agent.candidate_model
    if (
        candidate is not None
        and candidate.enabled
        and rollout_bucket(session.pk) < agent.candidate_percent
    ):
        return candidate, True
    return agent.model, False


def step_endpoints(
    agent: Agent, session: Session, called: ModelEndpoint | None = None
) -> list[ModelEndpoint]:
    """The endpoints this step may call: `called` (where the call goes first; None: the
    agent's model or rollout candidate), the fallback it retries on, and the agent's own
    model when `called` is another (a small model escalates to it)."""
    primary, _ = primary_endpoint(agent, session)
    endpoints = [called or primary]
    if called is not None and called.pk != primary.pk:
        endpoints.append(primary)
    fallback = agent.fallback_model
    if fallback is not None and fallback.enabled:
        endpoints.append(fallback)
    return endpoints


def request_window(agent: Agent, session: Session, called: ModelEndpoint | None = None) -> int:
    """The tightest window among the agent's and the endpoints this step may call."""
    return min(
        [agent.context_window, *(e.context_window for e in step_endpoints(agent, session, called))]
    )


def request_tokenizer(
    agent: Agent, session: Session, called: ModelEndpoint | None = None
) -> Tokenizer:
    """How the step counts tokens: the tokenizer of the endpoints it may call, the larger
    count of theirs when they differ, so the request fits each of them."""
    return tokenizer_strictest(
        [endpoint_tokenizer(e) for e in step_endpoints(agent, session, called)]
    )


def first_enabled_endpoint(
    *candidates: ModelEndpoint | None, default: ModelEndpoint
) -> ModelEndpoint:
    """The first candidate an operator has not disabled, else `default` (the agent's
    model): a disabled endpoint is never called, whichever side job asks for it."""
    for endpoint in candidates:
        if endpoint is not None and endpoint.enabled:
            return endpoint
    return default


def cheap_endpoint(agent: Agent) -> ModelEndpoint:
    """The model for the agent's small side jobs (dialogue state, memory extraction)."""
    return first_enabled_endpoint(agent.cheap_model, default=agent.model)


def endpoint_tokenizer(endpoint: ModelEndpoint) -> Tokenizer:
    """How `endpoint` counts tokens: its `tokenizer`, else its api's default."""
    return tokenizer_for(endpoint.api, endpoint.tokenizer, endpoint.tokenizer_ratio)


def endpoint_config(endpoint: ModelEndpoint) -> EndpointConfig:
    return EndpointConfig(
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


@dataclass
class Routed:
    response: ChatResponse | None
    endpoint: ModelEndpoint | None
    calls: list[ModelCall] = field(default_factory=list)
    error: ModelError | None = None


@dataclass
class _Timing:
    """When the call started and its first event arrived (filled in even when it fails)."""

    started: float = field(default_factory=time.perf_counter)
    first: float | None = None

    def first_ms(self) -> int | None:
        return None if self.first is None else int((self.first - self.started) * 1000)

    def total_ms(self) -> int:
        return int((time.perf_counter() - self.started) * 1000)


def _attempt(
    session: Session,
    endpoint: ModelEndpoint,
    request: ChatRequest,
    *,
    retried: bool,
    fallback: bool,
    rollout: bool,
    purpose: str = "step",
    record_failure: bool = True,
) -> tuple[ChatResponse | None, ModelCall, ModelError | None]:
    """One call to one endpoint, in a span of its own, counted in the metrics."""
    with tracing.model_span(endpoint=endpoint.name, api=endpoint.api, model=endpoint.model) as span:
        response, record, error = _attempt_call(
            session,
            endpoint,
            request,
            retried=retried,
            fallback=fallback,
            rollout=rollout,
            purpose=purpose,
            record_failure=record_failure,
        )
        _observe(span, endpoint, record, response, error)
    return response, record, error


def error_kind(error: ModelError) -> str | None:
    """The retry policy's name for a failed call (runtime/retry.py), None: not retried."""
    if isinstance(error, ModelTimeout):
        return "timeout"
    if isinstance(error, ModelRateLimited):
        return "429"
    if isinstance(error, ModelUnavailable):
        if error.status is None:
            return "connect"
        return "timeout" if error.status == 408 else "5xx"
    return None


def _attempts(
    session: Session,
    endpoint: ModelEndpoint,
    request: ChatRequest,
    *,
    fallback: bool,
    rollout: bool,
    calls: list[ModelCall],
) -> tuple[ChatResponse | None, ModelError | None]:
    """Call one endpoint as its retry policy says; every attempt's record goes to `calls`.

    1. Call; an answer, or an error the policy does not name, ends it.
    2. The wait before the next attempt (Retry-After, else backoff with jitter): one up
       to RETRY_INLINE_WAIT_S is slept here, without a database connection; a longer
       one is not waited for in a worker holding a run: the fallback model (or the
       busy answer) comes next, and the breaker keeps the endpoint aside meanwhile.
    3. The breaker hears of the failure once, when this endpoint gives up.
    """
    policy = retry_policy(endpoint.retry, MODEL_DEFAULT)
    tried = 0
    while True:
        tried += 1
        response, record, error = _attempt(
            session,
            endpoint,
            request,
            retried=fallback or tried > 1,
            fallback=fallback,
            rollout=rollout,
            record_failure=False,
        )
        calls.append(record)
        if error is None:
            return response, None
        wait = (
            policy.wait_s(tried, error.retry_after_s) if policy.retries(error_kind(error)) else None
        )
        if wait is None or wait > settings.RETRY_INLINE_WAIT_S:
            _breaker_failure(endpoint, error)
            return None, error
        give_back_connection()
        time.sleep(wait)


def _breaker_failure(endpoint: ModelEndpoint, error: ModelError) -> None:
    if error.outcome in ("breaker_open", "too_large", "bad_request"):
        return
    # A rate limit's Retry-After (capped) is the cool-down; other errors count toward it.
    after = error.retry_after_s if isinstance(error, ModelRateLimited) else None
    model_breaker().record_failure(
        endpoint.name, retry_after_s=None if after is None else min(after, RETRY_AFTER_CAP_S)
    )


def _observe(
    span: object,
    endpoint: ModelEndpoint,
    record: ModelCall,
    response: ChatResponse | None,
    error: ModelError | None,
) -> None:
    """The call's metrics and span attributes: names, kinds, counts and times, never contents."""
    name = endpoint.name
    if record.first_token_ms is not None:
        metrics.FIRST_TOKEN.labels(name).observe(record.first_token_ms / 1000)
    metrics.MODEL_CALL.labels(name, record.outcome).observe((record.total_ms or 0) / 1000)
    finish = response.finish_reason if response is not None else None
    if error is not None:
        metrics.MODEL_ERRORS.labels(name, error.outcome).inc()
        if error.outcome == "too_large":
            metrics.TOKEN_OVERRUNS.labels(name, "context").inc()
    else:
        metrics.MODEL_TOKENS.labels(name, "input").inc(record.input_tokens or 0)
        metrics.MODEL_TOKENS.labels(name, "output").inc(record.output_tokens or 0)
        if finish == "length":
            metrics.TOKEN_OVERRUNS.labels(name, "output").inc()
    tracing.model_result(
        span,
        model=endpoint.model,
        input_tokens=record.input_tokens or 0,
        output_tokens=record.output_tokens or 0,
        finish_reason=finish,
        error_kind=error.outcome if error is not None else None,
    )


def _attempt_call(
    session: Session,
    endpoint: ModelEndpoint,
    request: ChatRequest,
    *,
    retried: bool,
    fallback: bool,
    rollout: bool,
    purpose: str,
    record_failure: bool = True,
) -> tuple[ChatResponse | None, ModelCall, ModelError | None]:
    """One call to one endpoint, always described by an (unsaved) ModelCall.

    A side call (a summary, the dialogue state, a turn's memory extraction) is not
    streamed to the session's clients (they see no deltas of it) and cannot be
    cancelled mid-way; it is short.
    """
    config = endpoint_config(endpoint)
    record = ModelCall(
        turn=session.turn,
        step=0,
        endpoint=endpoint,
        endpoint_name=endpoint.name,
        api=endpoint.api,
        model=endpoint.model,
        retried=retried,
        fallback_used=fallback,
        rollout=rollout,
        outcome="success",
        purpose=purpose,
    )
    counter = endpoint_tokenizer(endpoint)
    estimated_in = estimate_request_tokens(request, counter)
    timing = _Timing()
    try:
        _may_call(endpoint, estimated_in)
        timing.started = time.perf_counter()
        response = (
            _quiet(config, request, timing)
            if purpose in SIDE_PURPOSES
            else _stream(session, config, request, timing)
        )
        if not has_text(response):
            raise ModelProtocolError(f"'{endpoint.name}' returned an empty answer")
    except RunCancelled as cancelled:
        record.outcome = "cancelled"
        record.error = "the turn was cancelled while the model answered"
        record.first_token_ms = timing.first_ms()
        record.total_ms = timing.total_ms()
        cancelled.calls.append(record)
        raise
    except ModelError as exc:
        _failed(endpoint, config, record, exc, timing, record_failure=record_failure)
        return None, record, exc
    _succeeded(endpoint, record, response, timing, estimated_in, counter)
    return response, record, None


def _may_call(endpoint: ModelEndpoint, estimated_in: int) -> None:
    """Refuse a call that cannot succeed before sending it (the ModelError it would end in)."""
    if estimated_in > endpoint.context_window:
        raise ModelRequestTooLarge(
            f"request of about {estimated_in} tokens does not fit the {endpoint.context_window}-token window of '{endpoint.name}'"
        )
    if endpoint.missing_key_env:
        # Sent without its key, the request would only be refused (or worse, answered
        # by a proxy that does not check): say which variable is missing instead.
        raise ModelKeyMissing(
            f"'{endpoint.name}' has no API key: environment variable {endpoint.missing_key_env} is not set"
        )
    if endpoint.api != "rules" and not model_breaker().allow(endpoint.name):
        raise ModelCircuitOpen(f"'{endpoint.name}' is cooling down after repeated failures")


def _failed(
    endpoint: ModelEndpoint,
    config: EndpointConfig,
    record: ModelCall,
    exc: ModelError,
    timing: _Timing,
    *,
    record_failure: bool,
) -> None:
    _scrub(exc, config)
    _log_failure(endpoint, exc)
    record.outcome = exc.outcome
    record.error = str(exc)[:1000]
    record.input_tokens = 0
    record.first_token_ms = timing.first_ms()
    record.total_ms = timing.total_ms()
    if exc.outcome not in ("breaker_open", "too_large", "bad_request"):
        # A slow failure (a timeout) is model latency too, for the sweeper's pacing.
        health.figures.model_call_done(record.total_ms / 1000)
    if record_failure:
        _breaker_failure(endpoint, exc)


def _succeeded(
    endpoint: ModelEndpoint,
    record: ModelCall,
    response: ChatResponse,
    timing: _Timing,
    estimated_in: int,
    counter: Tokenizer,
) -> None:
    """The call's times, tokens (the provider's, else estimated) and cost on its record."""
    model_breaker().record_success(endpoint.name)
    record.first_token_ms = timing.first_ms()
    record.total_ms = timing.total_ms()
    health.figures.model_call_done(record.total_ms / 1000)
    if response.usage is not None and (response.usage.input_tokens or response.usage.output_tokens):
        record.input_tokens, record.output_tokens = (
            response.usage.input_tokens,
            response.usage.output_tokens,
        )
    else:
        record.input_tokens, record.output_tokens = (
            estimated_in,
            estimate_response_tokens(response, counter),
        )
        record.tokens_estimated = True
    record.cost = model_call_cost(
        input_tokens=record.input_tokens,
        output_tokens=record.output_tokens,
        price_input_per_1k=endpoint.price_input_per_1k,
        price_output_per_1k=endpoint.price_output_per_1k,
    )


def _log_failure(endpoint: ModelEndpoint, exc: ModelError) -> None:
    """One WARNING line per failed call for the operator (the message is already scrubbed of the key)."""
    status = exc.status if exc.status is not None else exc.outcome
    reason = " ".join(str(exc).split())[:300]
    logger.warning(
        "model call failed: endpoint=%s url=%s status=%s reason=%s",
        endpoint.name,
        endpoint.base_url or f"({endpoint.api})",
        status,
        reason,
    )


def _scrub(exc: ModelError, config: EndpointConfig) -> None:
    """Last guard: neither the endpoint's key nor what the logs' scrubber removes (other
    credentials, e-mail addresses, card numbers a provider echoed back) leaves in an error:
    it becomes ModelCall.error, Session.last_error, a transition's reason and an `error`
    event. Adapters already redact the key in what they quote."""
    key = os.environ.get(config.api_key_env, "") if config.api_key_env else ""
    message = str(exc)
    scrubbed = scrub(redact(message, [key]) if key else message)
    if scrubbed != message:
        exc.args = (scrubbed,)


def give_back_connection() -> None:
    """Never hold a pooled database connection across a wait: a model call on the
    network, a rate limit's pause.

    An instant model call keeps it: nothing waits, and the step's commit right
    after would only borrow it again.
    """
    if not connection.in_atomic_block:
        connection.close()


def _stream(
    session: Session, config: EndpointConfig, request: ChatRequest, timing: _Timing
) -> ChatResponse:
    batcher = DeltaBatcher(session.pk, session.turn, settings.DELTA_FLUSH_MS)
    adapter = adapter_for(config)

    def on_event(event: StreamEvent) -> None:
        if timing.first is None:
            timing.first = time.perf_counter()
            fault_point("during_stream")
        batcher.on_event(event)

    async def call() -> ChatResponse:
        """Race the model's answer against a cancel of the session's turn."""
        watch = cancel_watch()
        cancelled = watch.register(session.pk)
        answer = asyncio.ensure_future(adapter.complete(request, on_event=on_event))
        waiter = asyncio.ensure_future(cancelled.wait())
        try:
            await asyncio.wait({answer, waiter}, return_when=asyncio.FIRST_COMPLETED)
            if answer.done():
                return answer.result()
            answer.cancel()  # closes the HTTP stream
            with contextlib.suppress(BaseException):
                await answer
            raise RunCancelled()
        finally:
            waiter.cancel()
            watch.unregister(session.pk, cancelled)
            batcher.flush()

    future: concurrent.futures.Future[ChatResponse] | None = None
    try:
        if adapter.instant():
            # No I/O and no wait (the offline rules model): on this thread, no
            # hop to the io loop; nothing to cancel in the microseconds it takes.
            try:
                return io_loop.run_inline(adapter.complete(request, on_event=on_event))
            finally:
                batcher.flush()
        give_back_connection()
        future = io_loop.submit(call())
        # The adapter enforces the endpoint's timeouts; this is only a backstop.
        return future.result(timeout=config.total_timeout_s + config.connect_timeout_s + 5)
    except concurrent.futures.TimeoutError:
        if future is not None:
            future.cancel()
        raise ModelTimeout(
            f"'{config.name}' did not finish within {config.total_timeout_s:g} s"
        ) from None
    except RunCancelled:
        raise
    except ModelError:
        if batcher.sent_chars:
            # The client saw part of an answer that will not enter the history.
            discarded: Progress = {"stage": "answer_discarded", "turn": session.turn}
            publish_ephemeral(session.pk, EventType.PROGRESS, discarded)
        raise
    except Exception as exc:  # noqa: BLE001 - an adapter bug must end as a recorded failure
        raise ModelError(f"'{config.name}' adapter failed: {type(exc).__name__}") from exc


def _quiet(config: EndpointConfig, request: ChatRequest, timing: _Timing) -> ChatResponse:
    """The whole answer at once, seen by nobody but the caller."""

    def on_event(event: StreamEvent) -> None:
        if timing.first is None:
            timing.first = time.perf_counter()

    adapter = adapter_for(config)
    future: concurrent.futures.Future[ChatResponse] | None = None
    try:
        if adapter.instant():
            return io_loop.run_inline(adapter.complete(request, on_event=on_event))
        give_back_connection()
        future = io_loop.submit(adapter.complete(request, on_event=on_event))
        return future.result(timeout=config.total_timeout_s + config.connect_timeout_s + 5)
    except concurrent.futures.TimeoutError:
        if future is not None:
            future.cancel()
        raise ModelTimeout(
            f"'{config.name}' did not finish within {config.total_timeout_s:g} s"
        ) from None
    except ModelError:
        raise
    except Exception as exc:  # noqa: BLE001 - an adapter bug must end as a recorded failure
        raise ModelError(f"'{config.name}' adapter failed: {type(exc).__name__}") from exc


# Calls the engine makes for itself (not the turn's answer): never streamed to clients.
SIDE_PURPOSES = frozenset({"summary", "dialogue", "extraction"})


def side_call(
    session: Session,
    endpoint: ModelEndpoint,
    request: ChatRequest,
    *,
    purpose: Literal["summary", "dialogue", "extraction"],
) -> tuple[ChatResponse | None, ModelCall]:
    """One call the engine makes for itself (a summary of the history, the dialogue state,
    what a finished turn is worth remembering): recorded and priced like any call (the
    caller commits and meters it), never raises."""
    response, record, _ = _attempt(
        session, endpoint, request, retried=False, fallback=False, rollout=False, purpose=purpose
    )
    return response, record


class RunCancelled(Exception):
    """The turn was cancelled while the model answered; the stream was closed."""

    def __init__(self) -> None:
        super().__init__("cancelled")
        self.calls: list[ModelCall] = []


def call_model(
    session: Session, agent: Agent, request: ChatRequest, *, tier: ModelEndpoint | None = None
) -> Routed:
    """Primary (or `tier`, the cheaper model of a degraded session), then one retry on the
    fallback; never raises ModelError (RunCancelled ends the turn)."""
    primary, rollout = (tier, False) if tier is not None else primary_endpoint(agent, session)
    fallback = agent.fallback_model
    candidates = [(primary, False, rollout)]
    if fallback is not None and fallback.pk != primary.pk and fallback.enabled:
        candidates.append((fallback, True, False))
    routed = Routed(response=None, endpoint=None)
    for endpoint, is_fallback, rolled_out in candidates:
        try:
            response, error = _attempts(
                session,
                endpoint,
                request,
                fallback=is_fallback,
                rollout=rolled_out,
                calls=routed.calls,
            )
        except RunCancelled as cancelled:
            cancelled.calls[:0] = routed.calls
            raise
        routed.response, routed.endpoint, routed.error = (
            response,
            endpoint if response else None,
            error,
        )
        if error is None or not error.retryable:
            break
    return routed


def has_text(response: ChatResponse) -> bool:
    return bool(response.text.strip()) or bool(response.tool_calls)


def tiers_record(calls: list[ModelCall], tier: str, reason: str) -> None:
    """Model routing: which tier served each call and why (recorded with the step)."""
    for call in calls:
        call.tier, call.tier_reason = tier, reason[:200]
