"""The tracing helpers against a real OTLP/HTTP receiver, in this process; and off means off."""

import sys
from collections.abc import Iterator

import pytest

from observability import tracing
from tests.observability.otlp_receiver import OtlpReceiver


@pytest.fixture
def traced(monkeypatch: pytest.MonkeyPatch) -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
        tracing.configure()
        try:
            yield receiver
        finally:
            tracing.shutdown()


def test_off_unless_the_standard_variables_ask() -> None:
    assert not tracing.wanted({})
    assert tracing.wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318"})
    assert tracing.wanted({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://x:4318/v1/traces"})
    assert not tracing.wanted(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "OTEL_SDK_DISABLED": "true"}
    )
    assert not tracing.wanted(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "OTEL_TRACES_EXPORTER": "none"}
    )


def test_off_every_helper_is_a_no_op_and_the_sdk_is_not_loaded() -> None:
    assert not tracing.enabled()
    assert tracing.carrier() == {}
    assert tracing.turn_begin(session_id="s", agent="a", turn=1) == ""
    with tracing.step_span("", session_id="s", state="processing", turn=1) as span:
        assert span is None
    with tracing.model_span(endpoint="e", api="openai", model="m") as span:
        tracing.model_result(
            span, model="m", input_tokens=1, output_tokens=1, finish_reason="stop", error_kind=None
        )
    tracing.tool_spans([("t", "c", "success", 3)], tracing.now_ns())
    # Nothing on the step path imported the SDK (another test may have, in this process).
    if "opentelemetry.sdk.trace" not in sys.modules:
        assert tracing._tracer is None


def test_a_turn_across_processes_is_one_trace_with_genai_attributes(traced: OtlpReceiver) -> None:
    # The web side: a request span; its context rides in the task's headers.
    with tracing.server_span("POST", "/api/v1/sessions/x/messages/", None):
        headers = tracing.carrier()
    assert headers["traceparent"].startswith("00-")
    # The worker side: attach the headers, open the turn, then a later step joins by traceparent.
    with tracing.attached(headers["traceparent"]):
        traceparent = tracing.turn_begin(session_id="s-1", agent="support", turn=1)
    with tracing.step_span(traceparent, session_id="s-1", state="processing", turn=1):
        with tracing.model_span(endpoint="main", api="anthropic", model="claude-x") as span:
            tracing.model_result(
                span, model="claude-x", input_tokens=12, output_tokens=7,
                finish_reason="tool_calls", error_kind=None,
            )  # fmt: skip
        tracing.tool_spans(
            [("lookup", "call_1", "success", 5), ("notify", "call_2", "timeout", 9)],
            tracing.now_ns(),
        )
    tracing.flush()
    spans = traced.wait_for(lambda s: len(s) >= 6)
    trace_ids = {s.trace_id for s in spans}
    assert trace_ids == {tracing.trace_id_of(traceparent)} == {headers["traceparent"][3:35]}
    by_name = {s.name: s for s in spans}
    chat = by_name["chat claude-x"]
    assert chat.attributes == {
        "gen_ai.operation.name": "chat",
        "gen_ai.system": "anthropic",
        "gen_ai.request.model": "claude-x",
        "gen_ai.response.model": "claude-x",
        "gen_ai.usage.input_tokens": 12,
        "gen_ai.usage.output_tokens": 7,
        "gen_ai.response.finish_reasons": ["tool_calls"],
        "agentplatform.endpoint": "main",
    }
    step = by_name["step processing"]
    assert chat.parent_span_id == step.span_id
    assert step.parent_span_id == by_name["invoke_agent support"].span_id
    assert (
        by_name["invoke_agent support"].parent_span_id
        == by_name["POST /api/v1/sessions/x/messages/"].span_id
    )
    notify = by_name["execute_tool notify"]
    assert notify.attributes["gen_ai.tool.call.id"] == "call_2"
    assert notify.attributes["error.type"] == "timeout" and notify.status_code == 2
    assert by_name["execute_tool lookup"].parent_span_id == step.span_id
