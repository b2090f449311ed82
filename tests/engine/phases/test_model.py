"""The model phase's choice of where a step's call goes, and how its request is counted:
the tightest window and the strictest tokenizer of the endpoints the step may call."""

import json

import pytest

from engine import session_run
from engine.model.calls import request_tokenizer, request_window, step_endpoints
from record.models import ModelEndpoint
from sessions.services import message_post
from tests.factories import AgentFactory, ModelEndpointFactory, SessionFactory
from tests.fakes.model_servers import Reply
from tests.reference_tokenizer import reference_wire_tokens

pytestmark = pytest.mark.django_db


def _endpoint(name: str, **fields: object) -> ModelEndpoint:
    fields.setdefault("api", "openai")
    fields.setdefault("base_url", "http://127.0.0.1:9/v1")
    return ModelEndpointFactory(name=name, **fields)


def test_a_fallback_with_another_tokenizer_counts_the_larger_of_both() -> None:
    main = _endpoint("main", tokenizer="o200k_base", context_window=8000)
    older = _endpoint("older", tokenizer="cl100k_base", context_window=4000)
    agent = AgentFactory(model=main, fallback_model=older)
    session = SessionFactory(agent=agent)
    assert request_tokenizer(agent, session).key == "max(o200k_base,cl100k_base)"
    assert request_window(agent, session) == 4000
    older.enabled = False  # never called: neither its window nor its tokenizer counts
    assert request_tokenizer(agent, session).key == "o200k_base"
    assert request_window(agent, session) == 8000


def test_the_rollout_candidate_is_counted_with_its_own_tokenizer() -> None:
    main = _endpoint("main", tokenizer="o200k_base")
    candidate = _endpoint("candidate", api="anthropic")
    agent = AgentFactory(model=main, candidate_model=candidate, candidate_percent=100)
    session = SessionFactory(agent=agent)
    assert step_endpoints(agent, session) == [candidate]
    assert request_tokenizer(agent, session).key == "max(o200k_base,estimate:3.5)"
    agent.candidate_percent = 0
    assert request_tokenizer(agent, session).key == "o200k_base"


def test_a_routed_small_model_may_escalate_so_the_agents_model_counts_too() -> None:
    main = _endpoint("main", tokenizer="cl100k_base", context_window=16000)
    small = _endpoint("small", context_window=6000)
    agent = AgentFactory(model=main)
    session = SessionFactory(agent=agent)
    assert step_endpoints(agent, session, small) == [small, main]
    assert request_window(agent, session, small) == 6000
    assert request_tokenizer(agent, session, small).key == "max(o200k_base,cl100k_base)"


# End to end: what goes over the wire fits, counted by an independent tokenizer ---------------

KEY_ENV = "FAKE_TOKENS_TEST_KEY"


def _json_heavy(n: int) -> str:
    rows = [
        {"id": f"{n:04d}-{i:08x}-4e29-a716-{n * i:012d}", "amount": n * 1000 + i * 7.25}
        for i in range(8)
    ]
    return f"Order records {n}: " + json.dumps(rows)


def _chinese(n: int) -> str:
    return (
        f"第{n}个问题：我的订单 SO-2026{n:04d} 还没有到，物流显示在海关被扣留了，请帮我查一下。" * 3
    )


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("tokenizer", ["o200k_base", "cl100k_base"])
@pytest.mark.parametrize("content", [_json_heavy, _chinese])
def test_every_request_on_the_wire_fits_the_window_as_tiktoken_counts_it(
    openai_server, monkeypatch, tokenizer: str, content
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv(KEY_ENV, "sk-tokens-test")
    endpoint = _endpoint(
        "wire",
        base_url=openai_server.base_url,
        model="fake-model",
        api_key_env=KEY_ENV,
        tokenizer=tokenizer,
        context_window=3000,
        first_token_timeout_s=3.0,
        total_timeout_s=10.0,
    )
    # The history may take most of the window: little slack but the buffer.
    budget = {"history": 0.8, "memory": 0, "input": 0.15}
    agent = AgentFactory(
        model=endpoint, system_prompt="你是客服助手。", tools=[], context_budget=budget
    )
    session = SessionFactory(agent=agent)
    answer = "好的，我查到了：" + json.dumps(
        {"状态": "海关扣留", "单号": "SO-20260001"}, ensure_ascii=False
    )
    # The same answer to a summary request too: used as the summary's text.
    openai_server.script(*([lambda _request: Reply(text=answer, usage=None)] * 90))
    for n in range(30):
        message_post(session=session, content=content(n))
        assert session_run(session_id=session.pk).stopped == "idle"
    requests = openai_server.requests
    assert len(requests) >= 30
    # Every one (the steps' and the summaries') fits; the window was what limited them.
    assert max(reference_wire_tokens(r.body, tokenizer) for r in requests) <= 3000
    assert len(requests[-1].messages) < 2 * 30
