"""Benchmark `context`: assembling a step's context at 20, 200 and 2,000 history messages.

For each size, a session of the bench database gets that many messages (turns of a
user question and an answer, every fifth with a tool round; 30-60 tokens each, counts
cached as the engine stores them). A conversation that long has been summarised by
the engine on its way (the 90% watermark): the bench writes that steady state, a
summary message covering the oldest part with those messages archived, as the
engine would have left it. Then, per step, one new message is committed (not
timed) and what a model step does to assemble its context is timed:

- `RunContext.history` (the run's cache: one query for the new message) and
- `assemble` (budget, trimming, watermarks; pure Python),

on an agent with a 32,000-token window (history partition 16,000 tokens), so the
largest sizes hold more than the window. The target: the time follows what the
model sees (bounded by the partition), not the whole conversation: p95 at 2,000
messages is within 3x of p95 at 200. The first read of a run (all live messages
in one query) is reported as well.

Token counts (memory/tokens.py), no target of their own (the step's overhead is the
`engine` benchmark's): the cost of one count per tokenizer for a prose, a JSON and a
Chinese message, fresh (a new message is counted once, when stored) and again (the
same text: a step's request re-counts the history's texts, kept by the tokenizer),
and a whole 200-message request counted as the budget gate does each step.
"""

import time
import uuid
from typing import Any

from . import fixtures
from .results_model import Result, figure
from .stats import percentile

SIZES = (20, 200, 2000)
WINDOW = 32000
AGENT = "bench-context"
WORDS = "the parcel left the depot on Monday and the courier expects to deliver it soon "


def _install() -> Any:
    from record.models import Agent, ModelEndpoint

    agent, _ = Agent.objects.update_or_create(
        slug=AGENT,
        defaults={
            "name": "bench: context assembly",
            "system_prompt": "You are a support assistant for parcels and orders.",
            "model": ModelEndpoint.objects.get(name=fixtures.INSTANT),
            "context_window": WINDOW,
            "tools": [],
            "rules": [{"answer": "ok"}],
        },
    )
    return agent


def _message(seq: int, turn: int, role: str, **fields: Any) -> Any:
    from memory.tokens import count_message_tokens
    from record.models import Message

    content = fields.pop("content", "")
    calls = fields.get("tool_calls") or []
    return Message(
        seq=seq,
        turn=turn,
        role=role,
        content=content,
        token_count=count_message_tokens(content, str(calls) if calls else ""),
        **fields,
    )


def _conversation(count: int) -> list[Any]:
    messages: list[Any] = []
    turn = 0
    while len(messages) < count:
        turn += 1
        seq = len(messages) + 1
        messages.append(_message(seq, turn, "user", content=f"Question {turn}: " + WORDS * 2))
        if turn % 5 == 0 and len(messages) + 3 <= count:
            call_id = f"call_{turn}"
            messages.append(
                _message(
                    seq + 1,
                    turn,
                    "assistant",
                    tool_calls=[{"id": call_id, "name": "track", "arguments": {"n": turn}}],
                )
            )
            messages.append(
                _message(
                    seq + 2,
                    turn,
                    "tool",
                    content='{"status": "in transit", "eta": "Tuesday"}',
                    tool_call_id=call_id,
                    name="track",
                    data={"status": "in transit", "eta": "Tuesday"},
                )
            )
        if len(messages) < count:
            messages.append(_message(len(messages) + 1, turn, "assistant", content=WORDS * 3))
    return messages[:count]


def _seed(count: int) -> Any:
    """A session with `count` messages, summarised the way the engine leaves a long one."""
    from django.utils import timezone

    from engine.model.context import SUMMARY_HEADING, SUMMARY_NAME
    from memory.budget import context_budget
    from record.models import Message, Session

    session = fixtures.sessions_create(AGENT, 1, username=f"bench-context-{count}")[0]
    messages = _conversation(count)
    history = context_budget(WINDOW).history
    live = 0
    through = 0
    for m in reversed(messages):
        live += m.token_count
        if live > history // 2 and m.role == "user":
            through = m.seq - 1
            break
    now = timezone.now()
    for m in messages:
        m.session_id = session.pk
        if m.seq <= through:
            m.archived_at = now
    if through:
        messages.append(
            _message(
                count + 1,
                messages[-1].turn,
                "system",
                name=SUMMARY_NAME,
                content=SUMMARY_HEADING + "\nKey facts and preferences:\n- " + WORDS * 3,
                data={"kind": "summary", "from_seq": 1, "through_seq": through},
            )
        )
        messages[-1].session_id = session.pk
    Message.objects.bulk_create(messages, batch_size=1000)
    Session.objects.filter(pk=session.pk).update(message_seq=len(messages), turn=messages[-1].turn)
    return Session.objects.get(pk=session.pk), through


def _measure(count: int, steps: int) -> dict[str, Any]:
    from engine.model.context import assemble
    from engine.run_cache import RunContext, agent_runtime
    from record.models import Message, Session

    session, through = _seed(count)
    agent = agent_runtime(session.agent_id).agent
    run = RunContext()
    started = time.perf_counter()
    first = run.history(session)
    first_read_ms = (time.perf_counter() - started) * 1000
    step_ms: list[float] = []
    assemble_ms: list[float] = []
    shown: list[int] = []
    for i in range(steps):
        seq = session.message_seq + 1
        Message.objects.create(
            session=session,
            seq=seq,
            turn=session.turn + 1,
            role="user",
            content=f"Step {i}: " + WORDS,
            token_count=40,
        )
        Session.objects.filter(pk=session.pk).update(message_seq=seq, turn=session.turn + 1)
        session = Session.objects.get(pk=session.pk)
        started = time.perf_counter()
        history = run.history(session)
        middle = time.perf_counter()
        assembly = assemble(agent=agent, history=history, tools={}, final=False)
        done = time.perf_counter()
        step_ms.append((done - started) * 1000)
        assemble_ms.append((done - middle) * 1000)
        shown.append(len(assembly.request.messages))
    return {
        "messages": count,
        "archived": through,
        "live_messages_read_first": len(first),
        "first_read_ms": round(first_read_ms, 3),
        "step_ms": step_ms,
        "assemble_ms": assemble_ms,
        "messages_sent_p50": percentile([float(s) for s in shown], 50),
    }


COUNT_TEXTS = {
    "prose": WORDS * 3,
    "json": '{"orders": [{"id": "550e8400-e29b-41d4-a716-446655440000", "number": '
    '"SO-20261127", "amount": 1234.56, "placed_at": "2026-11-27T09:15:00Z", '
    '"sku": [100234, 100235]}, {"id": "6fa459ea-ee8a-3ca4-894e-db77e160355e", '
    '"number": "SO-20261128", "amount": 89.9, "placed_at": "2026-11-28T17:02:00Z", '
    '"sku": [200871]}], "count": 2, "status": "exception: parcel held at customs"}',
    "chinese": "您好，我的订单还没有到，物流显示在海关被扣留了，请帮我查一下什么时候能送到。" * 2,
}
COUNTERS = (("o200k_base", None), ("cl100k_base", None), ("estimate", 3.5))


def _per_call_us(work: Any, calls: int) -> float:
    started = time.perf_counter()
    for i in range(calls):
        work(i)
    return (time.perf_counter() - started) / calls * 1e6


def _count_costs(calls: int = 2000) -> dict[str, float]:
    """Microseconds per count: per tokenizer and text, fresh and again; a whole request."""
    from llm.types import ChatMessage, ChatRequest
    from memory.tokens import estimate_request_tokens, tokenizer_for, tokenizer_get

    costs: dict[str, float] = {}
    for name, ratio in COUNTERS:
        counter = tokenizer_get(name, ratio)
        counter.count("warm up: the vocabulary loads at the first count")
        for kind, text in COUNT_TEXTS.items():
            fresh = [f"{i} {text}" for i in range(calls)]  # new strings, as new messages are
            costs[f"{counter.key} {kind} fresh"] = _per_call_us(
                lambda i, c=counter, f=fresh: c.count(f[i]), calls
            )
            costs[f"{counter.key} {kind} again"] = _per_call_us(
                lambda i, c=counter, t=text: c.count(t), calls
            )
    texts = list(COUNT_TEXTS.values())
    messages = tuple(
        ChatMessage(role="user", content=f"{n} " + texts[n % len(texts)]) for n in range(200)
    )
    for api in ("openai", "anthropic"):
        counter = tokenizer_for(api)
        costs[f"request of 200 messages, {counter.key}, first"] = _per_call_us(
            lambda i, c=counter: estimate_request_tokens(ChatRequest(messages=messages), c), 1
        )
        # Each step builds a new request of the same history's texts: counted anew, texts kept.
        costs[f"request of 200 messages, {counter.key}, a later step"] = _per_call_us(
            lambda i, c=counter: estimate_request_tokens(
                ChatRequest(messages=tuple(list(messages))), c
            ),
            50,
        )
    return costs


def run(*, steps: int = 200) -> Result:
    result = Result(
        name="context",
        title="Context assembly per step at 20, 200 and 2,000 history messages",
        params={"sizes": list(SIZES), "steps": steps, "window": WINDOW},
    )
    _install()
    # Warm the imports and the agent cache before anything is timed.
    _measure(20, 5)
    measured = {n: _measure(n, steps) for n in SIZES}
    q = percentile
    for n in SIZES:
        m = measured[n]
        result.figures += [
            figure(
                f"assembly_{n}_p50_ms",
                f"{n:,} messages: history + assemble, p50",
                q(m["step_ms"], 50),
                "ms",
            ),
            figure(
                f"assembly_{n}_p95_ms",
                f"{n:,} messages: history + assemble, p95",
                q(m["step_ms"], 95),
                "ms",
            ),
        ]
    for n in SIZES:
        result.figures.append(
            figure(
                f"assemble_only_{n}_p95_ms",
                f"{n:,} messages: assemble alone (no query), p95",
                q(measured[n]["assemble_ms"], 95),
                "ms",
            )
        )
    growth = q(measured[2000]["step_ms"], 95) / max(q(measured[200]["step_ms"], 95), 1e-6)
    result.figures.append(
        figure(
            "assembly_growth_2000_vs_200",
            "p95 at 2,000 messages / p95 at 200 (bounded by the window, not the history)",
            round(growth, 2),
            "x",
            le=3,
        )
    )
    counts = _count_costs()
    result.figures += [
        figure(
            "count_o200k_json_fresh_us",
            "one count, o200k_base, a 400-character JSON message, fresh",
            round(counts["o200k_base json fresh"], 2),
            "us",
        ),
        figure(
            "count_o200k_json_again_us",
            "one count, o200k_base, the same text again (kept)",
            round(counts["o200k_base json again"], 3),
            "us",
        ),
        figure(
            "count_request_200_later_step_us",
            "a step's request of 200 messages, o200k_base, counted by the gate",
            round(counts["request of 200 messages, o200k_base, a later step"], 1),
            "us",
        ),
    ]
    result.details = {
        "token_counts_us": {k: round(v, 3) for k, v in counts.items()},
    }
    result.details |= {
        str(n): {
            "archived_by_summary": m["archived"],
            "first_read_live_messages": m["live_messages_read_first"],
            "first_read_ms": m["first_read_ms"],
            "assemble_only_p50_ms": q(m["assemble_ms"], 50),
            "assemble_only_p95_ms": q(m["assemble_ms"], 95),
            "messages_sent_p50": m["messages_sent_p50"],
        }
        for n, m in measured.items()
    }
    result.notes.append(
        f"agent window {WINDOW:,} tokens; one new message per step (its insert not timed); "
        f"run id {uuid.uuid4().hex[:6]}"
    )
    return result
