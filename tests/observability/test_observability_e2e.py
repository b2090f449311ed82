"""Traces, metrics and logs of one turn on a real stack, with secrets planted everywhere.

A stack of its own (two daphnes, a Celery worker, beat) runs with traces exported
to a real OTLP/HTTP receiver on 127.0.0.1 (tests/observability/otlp_receiver.py),
Prometheus in multiprocess mode, JSON logs and every prompt sampled. The model
(a fake OpenAI server) calls an HTTP tool twice in one answer: once with
arguments full of an API key, an email address and a card number, whose result
echoes them; once so that the tool fails with an error quoting them and the
secret header the platform sent it. The REST request carries them in a header.

Then: one trace from the REST request through the Celery task to the worker's
steps, model call and tool calls (GenAI attributes), its id on the turn's events;
the metrics of web and worker processes summed at one token-protected endpoint;
JSON log lines with the ids; and the planted values in no log line of the web
and worker processes, no span attribute, no metric label, and in the owner's
events only where the owner's own data belongs (the model's arguments, the
tool's successful result), never in an error.
"""

import asyncio
import json
import os
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from observability.models import PromptSample
from record.models import Agent, ModelEndpoint
from tests.e2e.support import api, create_session, recv_frame, wait_events, ws_connect
from tests.factories import api_key_for
from tests.fakes.model_servers import Call, FakeModelServer, Reply
from tests.observability.otlp_receiver import OtlpReceiver, ReceivedSpan
from tests.stack import Stack, running_stack
from tools.models import Tool

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

API_KEY = "ap_PlantedKey9x8c7v6b5n4m3"
EMAIL = "planted.person@example.com"
CARD = "4111 1111 1111 1111"
HEADER_SECRET = "sk-header-Planted0123456789"
MODEL_KEY = "sk-model-Planted0123456789"
METRICS_TOKEN = "metrics-token-0123456789"
PLANTED = (API_KEY, EMAIL, CARD, CARD.replace(" ", ""), HEADER_SECRET, MODEL_KEY)

ARGS_OK = {"email": EMAIL, "card": CARD, "api_key": API_KEY, "mode": "ok"}
ARGS_FAIL = {"email": EMAIL, "card": CARD, "api_key": API_KEY, "mode": "fail"}


class _ToolHandler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
        reply: dict[str, Any]
        if body.get("mode") == "fail":
            status, reply = (
                422,
                {
                    "error": f"no customer {body.get('email')} with card {body.get('card')}; "
                    f"key {body.get('api_key')} refused, header {self.headers.get('X-Api-Key')}"
                },
            )
        else:
            status, reply = 200, {"customer": {"email": EMAIL, "card": CARD, "key": API_KEY}}
        raw = json.dumps(reply).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass


@pytest.fixture
def tool_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ToolHandler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def observed_stack(
    django_db_setup, django_db_blocker, tmp_path: Path
) -> Iterator[tuple[Stack, OtlpReceiver]]:  # type: ignore[no-untyped-def]
    prom = tmp_path / "prometheus"
    prom.mkdir()
    with OtlpReceiver() as receiver:
        extra = {
            "CELERY_QUEUE": f"agentplatform-obs-{os.getpid()}",
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
            "OTEL_BSP_SCHEDULE_DELAY": "200",
            "OTEL_SERVICE_NAME": "agentplatform-test",
            "PROMETHEUS_MULTIPROC_DIR": str(prom),
            "METRICS_TOKEN": METRICS_TOKEN,
            "LOG_FORMAT": "json",
            "PROMPT_SAMPLE_RATE": "1",
            "OBS_MODEL_KEY": MODEL_KEY,
            "TOOL_SECRET_OBS": HEADER_SECRET,
        }
        with (
            django_db_blocker.unblock(),
            running_stack(extra_env=extra, ready_timeout=120) as stack,
        ):
            yield stack, receiver


def _allowed_to_owner(event: dict[str, Any]) -> dict[str, Any]:
    """The event without the parts that are the owner's own data: what the model sent a
    tool, a tool's successful result, the conversation's messages other than failed
    tool results. Whatever is left (errors, reasons, states) must hold no planted value."""
    data = dict(event["data"])
    if event["type"] == "tool.started":
        data.pop("input", None)
    elif event["type"] == "tool.finished" and data.get("status") == "success":
        data.pop("output", None)
    elif event["type"] == "message.completed" and (
        data.get("role") in ("user", "assistant") or data.get("tool_call_id") == "call_ok"
    ):
        data.pop("content", None)
        data.pop("tool_calls", None)
    return data


def _leaks(text: str) -> list[str]:
    return [p for p in PLANTED if p in text]


def test_one_turn_is_traced_measured_and_logged_without_leaking_secrets(
    observed_stack: tuple[Stack, OtlpReceiver], tool_server: str
) -> None:
    stack, receiver = observed_stack
    with FakeModelServer("openai") as model:
        endpoint = ModelEndpoint.objects.create(
            name="obs-openai", api="openai", base_url=model.base_url, model="fake-obs-1",
            api_key_env="OBS_MODEL_KEY", first_token_timeout_s=5, total_timeout_s=10,
        )  # fmt: skip
        Tool.objects.create(
            name="lookup_customer", description="Look a customer up.", kind="http",
            url=f"{tool_server}/lookup", method="POST", timeout_s=5, side_effects=False,
            headers={"X-Api-Key": {"env": "TOOL_SECRET_OBS"}},
            parameters={"type": "object", "properties": {k: {"type": "string"} for k in ARGS_OK}},
        )  # fmt: skip
        Agent.objects.create(slug="obs-agent", model=endpoint, tools=["lookup_customer"])
        model.script(
            Reply(
                calls=[
                    Call("lookup_customer", ARGS_OK, id="call_ok"),
                    Call("lookup_customer", ARGS_FAIL, id="call_fail"),
                ]
            ),
            Reply(text="I looked the customer up."),
        )
        key = api_key_for("obs-owner", ("support",))
        with api(stack, key) as client:
            session_id = create_session(client, "obs-agent")
            response = client.post(
                f"/api/v1/sessions/{session_id}/messages/",
                json={"content": f"Find the customer {EMAIL}"},
                headers={"X-Customer-Card": CARD, "X-Debug-Key": API_KEY},
            )
            assert response.status_code == 202, response.text
            events = wait_events(
                client, session_id, lambda es: any(e["type"] == "turn.finished" for e in es),
                timeout=30, describe=lambda: stack.log_tail("worker"),
            )  # fmt: skip
            assert model.unscripted == 0 and len(model.requests) == 2

            # --- The trace id is on the turn's events, one trace for the turn -----------
            trace_ids = {
                e["data"]["trace_id"]
                for e in events
                if e["type"] in ("state.changed", "turn.finished") and "trace_id" in e["data"]
            }
            assert len(trace_ids) == 1, events
            (trace_id,) = trace_ids
            assert all("trace_id" in e["data"] for e in events if e["type"] == "state.changed"), (
                events
            )

            # --- What the owner sees: their data, but no secret in errors --------------
            finished = {
                e["data"]["call_id"]: e["data"] for e in events if e["type"] == "tool.finished"
            }
            assert finished["call_ok"]["status"] == "success"
            assert EMAIL in json.dumps(finished["call_ok"]["output"])  # the owner's own result
            assert finished["call_fail"]["status"] != "success"
            assert "[redacted:" in finished["call_fail"]["error"], finished["call_fail"]
            for event in events:
                assert not _leaks(json.dumps(_allowed_to_owner(event))), event
            # Another owner sees nothing of it.
            with api(stack, api_key_for("obs-stranger", ("support",))) as stranger:
                assert stranger.get(f"/api/v1/sessions/{session_id}/events/").status_code == 404

            # --- Metrics: token-protected, every process summed ------------------------
            assert httpx.get(f"{stack.http}/metrics", timeout=10).status_code == 404
            scrape = httpx.get(
                f"{stack.http}/metrics",
                headers={"Authorization": f"Bearer {METRICS_TOKEN}"},
                timeout=10,
            )
            assert scrape.status_code == 200, scrape.text
            metrics = scrape.text
            for expected in (
                'agent_tool_calls_total{status="success",tool="lookup_customer"} 1.0',
                'agent_tool_calls_total{status="failed",tool="lookup_customer"} 1.0',
                'agent_model_first_token_seconds_count{endpoint="obs-openai"} 2.0',
                'agent_step_seconds_count{state="processing"}',
                "agent_turn_tool_calls_sum 2.0",
                'agent_turns_total{stop_reason="answer"} 1.0',
                'agent_sessions{state="finished"} 1.0',
                "agent_queue_depth{",
                "agent_runs_in_flight ",
                "agent_approvals_pending 0.0",
                "agent_credits_reserved 0.0",
                'agent_metrics_source_up{source="sessions_gauges"} 1.0',
            ):
                assert expected in metrics, f"{expected} missing from:\n{metrics}"
            assert not _leaks(metrics)

            # --- Websockets: counted while open, and their frames hold no secret either ---
            def scrape_sockets() -> str:
                text = httpx.get(
                    f"{stack.http}/metrics",
                    headers={"Authorization": f"Bearer {METRICS_TOKEN}"},
                    timeout=10,
                ).text
                (line,) = [
                    x for x in text.splitlines() if x.startswith("agent_websocket_connections ")
                ]
                return line.split()[1]

            async def watch() -> tuple[list[dict[str, Any]], str]:
                async with (
                    ws_connect(stack, session_id, key, after=0) as first,
                    ws_connect(stack, session_id, key, after=0) as second,
                ):
                    frames = [await recv_frame(first) for _ in events]
                    await recv_frame(second)
                    return frames, await asyncio.to_thread(scrape_sockets)

            frames, open_sockets = asyncio.run(watch())
            assert open_sockets == "2.0"
            assert [f["seq"] for f in frames] == [e["seq"] for e in events]
            for frame in frames:
                assert not _leaks(json.dumps(_allowed_to_owner(frame))), frame
            deadline = time.monotonic() + 10
            while scrape_sockets() != "0.0":
                assert time.monotonic() < deadline, "closed websockets still counted"
                time.sleep(0.2)

        # --- The trace: REST request -> Celery -> worker, GenAI attributes ----------------
        def complete(spans: list[ReceivedSpan]) -> bool:
            names = [s.name for s in spans if s.trace_id == trace_id]
            return (
                sum(n.startswith("execute_tool") for n in names) == 2
                and sum(n.startswith("chat ") for n in names) == 2
                and any(n.startswith("POST /api/v1/sessions/") for n in names)
            )

        spans = receiver.wait_for(complete, timeout=20)
        ours = [s for s in spans if s.trace_id == trace_id]
        by_id = {s.span_id: s for s in ours}
        (server,) = [s for s in ours if s.name.startswith("POST /api/v1/sessions/")]
        (turn,) = [s for s in ours if s.name == "invoke_agent obs-agent"]
        assert server.parent_span_id == ""  # the root: the request the client sent
        # The turn hangs under the request (through the Celery task's headers).
        chain, parent = [], turn.parent_span_id
        while parent:
            chain.append(by_id[parent].name)
            parent = by_id[parent].parent_span_id
        assert chain[-1] == server.name, chain
        chats = [s for s in ours if s.name == "chat fake-obs-1"]
        assert len(chats) == 2
        for chat in chats:
            assert chat.attributes["gen_ai.system"] == "openai"
            assert chat.attributes["gen_ai.operation.name"] == "chat"
            assert chat.attributes["gen_ai.request.model"] == "fake-obs-1"
            assert chat.attributes["gen_ai.response.model"] == "fake-obs-1"
            assert chat.attributes["gen_ai.usage.input_tokens"] == 10
            assert chat.attributes["gen_ai.usage.output_tokens"] == 5
            assert by_id[chat.parent_span_id].name == "step processing"
            assert by_id[by_id[chat.parent_span_id].parent_span_id].name == turn.name
        assert sorted(c.attributes["gen_ai.response.finish_reasons"][0] for c in chats) == [
            "stop",
            "tool_calls",
        ]
        tools = {
            s.attributes["gen_ai.tool.call.id"]: s
            for s in ours
            if s.name.startswith("execute_tool")
        }
        assert set(tools) == {"call_ok", "call_fail"}
        assert all(t.attributes["gen_ai.tool.name"] == "lookup_customer" for t in tools.values())
        assert by_id[tools["call_ok"].parent_span_id].name == "step tool_wait"
        assert tools["call_fail"].status_code == 2  # STATUS_CODE_ERROR
        for span in spans:
            assert not _leaks(span.name + json.dumps(span.attributes, default=str)), span

        # --- Prompt samples: the only place contents are kept whole -------------------
        samples = list(PromptSample.objects.filter(session_id=session_id).order_by("iteration"))
        assert [s.iteration for s in samples] == [1, 2]
        assert EMAIL in json.dumps(samples[0].request) and samples[0].trace_id == trace_id

    # --- Logs of the web and worker processes: JSON with ids, nothing planted ---------
    time.sleep(0.5)  # the last lines reach the files
    worker_log = stack.logs["worker"].read_text(errors="replace")
    web_log = stack.logs["web"].read_text(errors="replace")
    assert not _leaks(worker_log), [p for p in PLANTED if p in worker_log]
    assert not _leaks(web_log), [p for p in PLANTED if p in web_log]
    lines = [json.loads(line) for line in worker_log.splitlines() if line.startswith("{")]
    ran = [line for line in lines if line["event"].startswith("tool call ran:")]
    assert len(ran) == 2, worker_log[-3000:]
    for line in ran:
        assert line["session"] == session_id and line["turn"] == 1 and "step" in line
        assert line["trace_id"] == trace_id
        assert "arguments=" in line["event"] and "B:" in line["event"]
    failed = [line for line in lines if line["event"].startswith("tool call failed")]
    assert failed and failed[0]["level"] == "warning"
