"""The demo request end to end on each wire protocol: daphne + a Celery worker + beat, with the
agent's model pointed at a fake provider (a real HTTP server in this process) that plays the
model's part: query_orders -> 3 parallel send_notification -> generate_report -> final text."""

import asyncio
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from demo.handlers import query_orders
from record.models import Agent, ModelCall, ModelEndpoint
from tests.demo_setup import DEMO_REQUEST, demo_install
from tests.e2e.support import (
    api,
    async_api,
    collect_until,
    create_session,
    get_messages,
    ws_connect,
)
from tests.factories import api_key_for
from tests.fakes.fixtures import fake_servers  # noqa: F401 - the servers, started once per run
from tests.fakes.model_servers import Call, FakeModelServer, FakeServers, Recorded, Reply

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

FINAL = "Done: I found {count} delayed orders, notified each customer and wrote the report."
Frame = dict[str, Any]


@pytest.fixture
def fakes(fake_servers: FakeServers) -> Iterator[FakeServers]:  # noqa: F811
    """Both fake providers, with empty scripts; a script step that raised fails the test."""
    fake_servers.reset()
    yield fake_servers
    errors = fake_servers.openai.errors + fake_servers.anthropic.errors
    fake_servers.reset()
    assert not errors, errors


def _calls_reply(api_name: str, calls: list[Call]) -> Reply:
    if api_name == "prompt_tools":
        payload = {"tool_calls": [{"name": c.name, "arguments": c.arguments} for c in calls]}
        # A text-only model, slightly sloppy: a code fence around the JSON.
        return Reply(
            text="```json\n" + json.dumps(payload, ensure_ascii=False) + "\n```", text_splits=16
        )
    return Reply(calls=calls, interleave=True)


def demo_script(api_name: str) -> list[Any]:
    """The model's side of the demo. The orders are what query_orders returns on the demo
    data (computed here the same way); each step checks it was shown the previous results."""
    found = query_orders(days=7, logistics_status="exception")
    orders = found["orders"]

    def find(_request: Recorded) -> Reply:
        return _calls_reply(
            api_name,
            [Call("query_orders", {"days": 7, "logistics_status": "exception"}, splits=[3, 11])],
        )

    def notify(request: Recorded) -> Reply:
        shown = str(request.last_tool_result())
        assert all(o["order_number"] in shown for o in orders), shown
        calls = [
            Call(
                "send_notification",
                {
                    "customer_id": o["customer_id"],
                    "order_number": o["order_number"],
                    "message": f"Hallo {o['customer_name']}, Ihre Bestellung {o['order_number']} ist verzögert — wir kümmern uns 📦",
                },
                splits=7,
            )
            for o in orders
        ]
        return _calls_reply(api_name, calls)

    def report(request: Recorded) -> Reply:
        assert len(request.tool_results()) == 1 + len(orders)
        lines = [
            f"{o['order_number']} ({o['customer_name']}): {o['exception']}; notified"
            for o in orders
        ]
        return _calls_reply(
            api_name,
            [Call("generate_report", {"title": "Logistics exceptions", "lines": lines}, splits=13)],
        )

    def answer(request: Recorded) -> Reply:
        assert "report_id" in str(request.last_tool_result())
        text = FINAL.format(count=found["count"])
        if api_name == "prompt_tools":
            return Reply(text=json.dumps({"answer": text}), text_splits=8, delay_s=0.02)
        return Reply(text=text, text_splits=6, delay_s=0.02)

    return [find, notify, report, answer]


def _point_agent_at(server: FakeModelServer, api_name: str) -> ModelEndpoint:
    endpoint = ModelEndpoint.objects.create(
        name=f"e2e-{api_name.replace('_', '-')}-{uuid.uuid4().hex[:8]}",
        api=api_name,
        base_url=server.base_url,
        model=f"fake-{api_name}",
        first_token_timeout_s=5,
        total_timeout_s=20,
    )
    Agent.objects.filter(slug="order-support").update(model=endpoint)
    return endpoint


def _run_demo(live_stack: Any, user: str) -> tuple[str, list[Frame], list[dict[str, Any]]]:
    key = api_key_for(user)
    with api(live_stack, key) as client:
        session_id = create_session(client, "order-support")

        async def scenario() -> list[Frame]:
            async with ws_connect(live_stack, session_id, key, after=0) as ws:
                async with async_api(live_stack, key) as aclient:
                    posted = await aclient.post(
                        f"/api/v1/sessions/{session_id}/messages/", json={"content": DEMO_REQUEST}
                    )
                    assert posted.status_code == 202, posted.text
                return await collect_until(
                    ws, lambda frame, _frames: frame["type"] == "turn.finished", timeout=40
                )

        frames = asyncio.run(scenario())
        messages = get_messages(client, session_id)
    return session_id, frames, messages


@pytest.mark.parametrize("api_name", ["openai", "anthropic", "prompt_tools"])
def test_the_demo_request_runs_on_each_wire_protocol(live_stack, fakes, api_name):
    demo_install()
    server = fakes.anthropic if api_name == "anthropic" else fakes.openai
    endpoint = _point_agent_at(server, api_name)
    server.script(*demo_script(api_name))

    session_id, frames, messages = _run_demo(live_stack, f"alice-{api_name}")
    debug = "\n".join(f"{f['seq']} {f['type']} {json.dumps(f['data'])[:160]}" for f in frames)

    assert (
        frames[-1]["type"] == "turn.finished" and frames[-1]["data"]["stop_reason"] == "answer"
    ), debug
    tools_run = [f["data"]["tool"] for f in frames if f["type"] == "tool.finished"]
    assert tools_run == [
        "query_orders",
        "send_notification",
        "send_notification",
        "send_notification",
        "generate_report",
    ], debug
    assert all(f["data"]["status"] == "success" for f in frames if f["type"] == "tool.finished"), (
        debug
    )

    # Tool preparation shows as progress frames naming the tool, never as text.
    prepared = [
        f["data"]["tool"]
        for f in frames
        if f["type"] == "progress" and f["data"].get("stage") == "preparing_tool"
    ]
    assert prepared == [
        "query_orders",
        "send_notification",
        "send_notification",
        "send_notification",
        "generate_report",
    ], debug
    assert all(f["seq"] is None for f in frames if f["type"] in ("progress", "message.delta"))

    # The final answer is streamed as message.delta frames; no tool-call JSON ever is.
    deltas = [f["data"]["text"] for f in frames if f["type"] == "message.delta"]
    final = messages[-1]
    assert final["role"] == "assistant" and final["content"].startswith(
        "Done: I found 3 delayed orders"
    ), messages
    assert "".join(deltas) == final["content"], debug
    if api_name != "prompt_tools":  # prompt_tools holds the reply back until it is parsed
        chunks = len(range(0, len(final["content"]), 6))
        assert 2 <= len(deltas) < chunks, (
            debug
        )  # streamed, and batched (~50 ms), not one frame per chunk
    for text in deltas:
        assert "{" not in text and "tool_calls" not in text and "customer_id" not in text, text

    # The fake model got one request per step, the last one carrying every tool result.
    requests = server.requests
    assert len(requests) == 4
    assert len(requests[-1].tool_results()) == 5
    rows = list(ModelCall.objects.filter(session_id=session_id).order_by("id"))
    assert [(r.endpoint_name, r.api, r.outcome) for r in rows] == [
        (endpoint.name, api_name, "success")
    ] * 4


def test_a_stream_cut_midway_is_discarded_and_the_fallback_answers(live_stack, fakes):
    openai_server, anthropic_server = fakes.openai, fakes.anthropic
    demo_install()
    primary = _point_agent_at(openai_server, "openai")
    fallback = ModelEndpoint.objects.create(
        name=f"e2e-fallback-{uuid.uuid4().hex[:8]}",
        api="anthropic",
        base_url=anthropic_server.base_url,
        model="fake",
    )
    Agent.objects.filter(slug="order-support").update(fallback_model=fallback, tools=[])
    openai_server.script(
        Reply(
            text="This answer will never be finished because",
            text_splits=5,
            delay_s=0.06,
            cut_after=8,
        )
    )
    anthropic_server.script(
        Reply(text="Here is the complete answer from the fallback.", delay_s=0.02)
    )

    session_id, frames, messages = _run_demo(live_stack, "bob-cut")
    debug = "\n".join(f"{f['seq']} {f['type']} {json.dumps(f['data'])[:160]}" for f in frames)

    types = [
        f["type"] if f["type"] != "progress" else f"progress:{f['data'].get('stage')}"
        for f in frames
    ]
    assert "progress:answer_discarded" in types, debug
    cut_at = types.index("progress:answer_discarded")
    before = "".join(f["data"]["text"] for f in frames[:cut_at] if f["type"] == "message.delta")
    after = "".join(f["data"]["text"] for f in frames[cut_at:] if f["type"] == "message.delta")
    assert before and "This answer will never be finished because".startswith(before), debug
    assert after == "Here is the complete answer from the fallback.", debug
    # The history holds only the complete answer: no half message.
    assistant = [m["content"] for m in messages if m["role"] == "assistant"]
    assert assistant == ["Here is the complete answer from the fallback."]
    rows = list(ModelCall.objects.filter(session_id=session_id).order_by("id"))
    assert [(r.endpoint_name, r.outcome, r.fallback_used) for r in rows] == [
        (primary.name, "protocol_error", False),
        (fallback.name, "success", True),
    ]
    assert frames[-1]["type"] == "turn.finished" and frames[-1]["data"]["stop_reason"] == "answer"
