"""OpenTelemetry traces: a trace per turn, a span per step, model call and tool call.

Off unless configured by the standard variables: `OTEL_EXPORTER_OTLP_ENDPOINT`
(or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) turns it on, `OTEL_SDK_DISABLED=true`
or `OTEL_TRACES_EXPORTER=none` keeps it off; the exporter (OTLP over HTTP) reads
the other `OTEL_*` variables itself (headers, timeout, batch delay, service name).
Off, the SDK is never imported and every helper here returns at its first line
(a shared null context), so the step path pays one attribute check.

The trace of a turn crosses processes: the REST request's span (middleware.py)
is injected into the Celery task's headers (`carrier`), the worker attaches it
(`attached`), the turn's span is its child, and the turn's span context is kept
on the session row (`Session.trace_parent`, a W3C traceparent) so every later
step of the turn, on whichever worker and after whatever wait, joins the same
trace. Attribute names follow the OpenTelemetry GenAI semantic conventions.
Only ids, names, counts and sizes go into attributes, never contents.
"""

import os
import time
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

_NULL: AbstractContextManager[Any] = nullcontext()
_tracer: Any = None  # opentelemetry.trace.Tracer once configured
_provider: Any = None
_propagator: Any = None

# GenAI semantic conventions (gen_ai.*), spelled once.
SYSTEM = "gen_ai.system"
OPERATION = "gen_ai.operation.name"
REQUEST_MODEL = "gen_ai.request.model"
RESPONSE_MODEL = "gen_ai.response.model"
INPUT_TOKENS = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
FINISH_REASONS = "gen_ai.response.finish_reasons"
TOOL_NAME = "gen_ai.tool.name"
TOOL_CALL_ID = "gen_ai.tool.call.id"
AGENT_NAME = "gen_ai.agent.name"
CONVERSATION_ID = "gen_ai.conversation.id"
ERROR_TYPE = "error.type"

# The wire protocol of an endpoint as the conventions' provider name.
SYSTEMS = {"openai": "openai", "anthropic": "anthropic", "prompt_tools": "openai"}


def wanted(environ: Mapping[str, str] = os.environ) -> bool:
    """Do the standard OTEL_* variables ask for traces?"""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() in ("none", ""):
        return False
    return bool(
        environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    )


def configure() -> None:
    """Set up the SDK with a batching OTLP/HTTP exporter, once per process, if wanted."""
    global _tracer, _provider, _propagator
    if _tracer is not None or not wanted():
        return
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    # OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES are read by Resource.create.
    resource = Resource.create(
        {"service.name": os.environ.get("OTEL_SERVICE_NAME", "agentplatform")}
    )
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    _provider = provider
    _propagator = TraceContextTextMapPropagator()
    _tracer = provider.get_tracer("agentplatform")


def enabled() -> bool:
    return _tracer is not None


def flush(timeout_ms: int = 5000) -> None:
    if _provider is not None:
        _provider.force_flush(timeout_ms)


def shutdown() -> None:
    """Export what is buffered and stop (tests; processes do it at exit by themselves)."""
    global _tracer, _provider
    if _provider is not None:
        _provider.shutdown()
    _tracer = _provider = None


# --- Carrying the context ------------------------------------------------------------------


def carrier() -> dict[str, str]:
    """The current span context as W3C headers (for a Celery task); {} when off or none."""
    if _tracer is None:
        return {}
    headers: dict[str, str] = {}
    _propagator.inject(headers)
    return headers


def _context_of(traceparent: str | None) -> Any:
    return _propagator.extract({"traceparent": traceparent}) if traceparent else None


@contextmanager
def _attach(ctx: Any) -> Iterator[None]:
    from opentelemetry import context as otel_context

    token = otel_context.attach(ctx)
    try:
        yield
    finally:
        otel_context.detach(token)


def attached(traceparent: str | None) -> AbstractContextManager[Any]:
    """Make a remote parent (a Celery task's `traceparent` header) the current context."""
    if _tracer is None or not traceparent:
        return _NULL
    return _attach(_context_of(traceparent))


def current_trace_id() -> str:
    """The current trace id (32 hex digits) for log lines; "" when off or outside a span."""
    if _tracer is None:
        return ""
    from opentelemetry import trace

    context = trace.get_current_span().get_span_context()
    return format(context.trace_id, "032x") if context.is_valid else ""


def trace_id_of(traceparent: str) -> str:
    """The trace id of a stored traceparent ("00-<trace id>-<span id>-<flags>")."""
    return traceparent[3:35] if len(traceparent) >= 35 else ""


# --- Spans ---------------------------------------------------------------------------------


def turn_begin(*, session_id: str, agent: str, turn: int) -> str:
    """Open the turn's trace and return the traceparent its steps will join ("" when off).

    The turn's span is a child of the current context (the REST request's, when the
    task carried it) and ends at once: a turn outlives the task that starts it
    (approvals, questions, timers), so its span marks the start and its steps
    hang under it, each ending when it ends.
    """
    if _tracer is None:
        return ""
    span = _tracer.start_span(
        f"invoke_agent {agent}",
        attributes={
            OPERATION: "invoke_agent",
            AGENT_NAME: agent,
            CONVERSATION_ID: session_id,
            "agentplatform.turn": turn,
        },
    )
    headers: dict[str, str] = {}
    from opentelemetry import trace

    _propagator.inject(headers, context=trace.set_span_in_context(span))
    span.end()
    return headers.get("traceparent", "")


def step_span(
    traceparent: str, *, session_id: str, state: str, turn: int
) -> AbstractContextManager[Any]:
    """A span around one step, in the trace of its turn."""
    if _tracer is None:
        return _NULL
    return _tracer.start_as_current_span(
        f"step {state}",
        context=_context_of(traceparent),
        attributes={
            CONVERSATION_ID: session_id,
            "agentplatform.state": state,
            "agentplatform.turn": turn,
        },
    )


def model_span(*, endpoint: str, api: str, model: str) -> AbstractContextManager[Any]:
    """A span around one model call (a child of the current step); yields the span or None."""
    if _tracer is None:
        return _NULL
    return _tracer.start_as_current_span(
        f"chat {model}",
        attributes={
            OPERATION: "chat",
            SYSTEM: SYSTEMS.get(api, api),
            REQUEST_MODEL: model,
            "agentplatform.endpoint": endpoint,
        },
        record_exception=False,  # an exception's message may quote what the provider sent
        set_status_on_exception=True,
    )


def model_result(
    span: Any,
    *,
    model: str,
    input_tokens: int,
    output_tokens: int,
    finish_reason: str | None,
    error_kind: str | None,
) -> None:
    if span is None:
        return
    span.set_attribute(RESPONSE_MODEL, model)
    span.set_attribute(INPUT_TOKENS, input_tokens)
    span.set_attribute(OUTPUT_TOKENS, output_tokens)
    if finish_reason:
        span.set_attribute(FINISH_REASONS, [finish_reason])
    if error_kind:
        from opentelemetry.trace import Status, StatusCode

        span.set_attribute(ERROR_TYPE, error_kind)
        span.set_status(Status(StatusCode.ERROR))


def tool_spans(calls: list[tuple[str, str, str, int]], started_ns: int) -> None:
    """Spans for tool calls that ran concurrently from `started_ns` (children of the current
    step): (tool name, call id, status, elapsed ms) each. Recorded after the fact: the calls
    ran on the process's io loop, outside this thread's context."""
    if _tracer is None:
        return
    from opentelemetry.trace import SpanKind, Status, StatusCode

    for name, call_id, status, elapsed_ms in calls:
        span = _tracer.start_span(
            f"execute_tool {name}",
            kind=SpanKind.INTERNAL,
            start_time=started_ns,
            attributes={
                OPERATION: "execute_tool",
                TOOL_NAME: name,
                TOOL_CALL_ID: call_id,
                "agentplatform.tool.status": status,
            },
        )
        if status != "success":
            span.set_attribute(ERROR_TYPE, status)
            span.set_status(Status(StatusCode.ERROR))
        span.end(end_time=started_ns + max(elapsed_ms, 0) * 1_000_000)


def now_ns() -> int:
    return time.time_ns()


def server_span(method: str, route: str, traceparent: str | None) -> AbstractContextManager[Any]:
    """The span of one REST request (a child of the caller's traceparent, if it sent one)."""
    if _tracer is None:
        return _NULL
    from opentelemetry.trace import SpanKind

    return _tracer.start_as_current_span(
        f"{method} {route}",
        context=_context_of(traceparent),
        kind=SpanKind.SERVER,
        attributes={"http.request.method": method, "http.route": route},
        record_exception=False,
    )
