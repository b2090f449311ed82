"""Summaries of the oldest history: the context budget's 90% watermark.

When `assemble` (engine/model/context.py) reports that the history passed
its summary watermark, the model step asks a cheap model to condense the
oldest third (merged with the previous summary) into four sections: the
user's intent, key facts and preferences, actions done, open items. The
summary is a system message named `context_summary` whose `data` holds the
sections and the last seq it covers; it commits with the step, which marks
the originals archived (`Message.archived_at`; never deleted). Being a
message, it survives restarts, is copied by a fork and shows in the admin
timeline. A failed summary costs nothing but its ModelCall row: the step goes
on with a trimmed history, and the next attempt waits (`summary_retry_at`):
30 s after one failure, doubling per consecutive failure up to 15 minutes, so
a broken summary model is not paid for (or waited on) at every step.

The summary model: `Agent.summary_model`, else the cheap model, else the
fallback, else the agent's own. The offline `rules` model answers with a
deterministic extract (llm/rules.py), so the demo summarises offline.
"""

import json
import logging
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import connection

from engine.model.calls import endpoint_tokenizer, first_enabled_endpoint, side_call
from engine.model.context import SUMMARY_HEADING, SUMMARY_NAME, cap_text, message_tokens
from llm.types import ChatMessage, ChatRequest
from memory.tokens import Tokenizer, count_message_tokens
from sessions.models import Agent, Message, ModelCall, ModelCallOutcome, ModelEndpoint, Session

logger = logging.getLogger(__name__)

SECTIONS = ("intent", "facts", "actions", "open_items")
INSTRUCTIONS = """You condense the oldest part of a conversation between a user and an assistant, so the assistant can go on without it. Answer with one JSON object and nothing else:
{"intent": "...", "facts": ["..."], "actions": ["..."], "open_items": ["..."]}
- intent: what the user wants overall, in one sentence.
- facts: every fact, preference, identifier, number or decision the user stated or confirmed; keep exact values (names, ids, dates, amounts).
- actions: what the assistant already did (tools called and their outcome), briefly.
- open_items: what is still unanswered or left to do.
Merge the previous summary if one is given: keep its facts unless the conversation changed them."""
# Per message of the transcript: enough for the facts, not a whole tool result.
TRANSCRIPT_MESSAGE_CHARS = 600
SUMMARY_OUTPUT_TOKENS = 600
# After a failed summary: the first retry's wait, doubled per consecutive failure, capped.
SUMMARY_RETRY_BASE_S = 30
SUMMARY_RETRY_MAX_S = 900


@dataclass
class SummaryOutcome:
    message: Message | None = None
    calls: list[ModelCall] = field(default_factory=list)


def summary_retry_at(session: Session) -> datetime | None:
    """When a summary may be tried again after failed ones; None when the last one succeeded.

    Read only when the history passed its watermark. The ModelCall rows are the
    record, so the wait holds across workers and restarts without another store.
    """
    recent = list(
        ModelCall.objects.filter(session_id=session.pk, purpose="summary")
        .order_by("-id")
        .values_list("outcome", "created_at")[:6]
    )
    failures = 0
    for outcome, _ in recent:
        if outcome == ModelCallOutcome.SUCCESS:
            break
        failures += 1
    if not failures:
        return None
    wait = min(SUMMARY_RETRY_BASE_S * 2 ** (failures - 1), SUMMARY_RETRY_MAX_S)
    return recent[0][1] + timedelta(seconds=wait)


def summary_endpoint(agent: Agent) -> ModelEndpoint:
    return first_enabled_endpoint(
        agent.summary_model, agent.cheap_model, agent.fallback_model, default=agent.model
    )


def _transcript(messages: tuple[Message, ...]) -> tuple[str, list[dict[str, Any]]]:
    lines: list[str] = []
    rows: list[dict[str, Any]] = []
    for m in messages:
        text = m.content
        if m.role == "assistant" and m.tool_calls:
            calls = ", ".join(
                f"{c.get('name')}({json.dumps(c.get('arguments') or {}, ensure_ascii=False)})"
                for c in m.tool_calls
            )
            text = f"{text} [called {calls}]".strip()
        who = f"tool {m.name}" if m.role == "tool" else m.role
        text = text[:TRANSCRIPT_MESSAGE_CHARS]
        lines.append(f"{who}: {text}")
        rows.append({"role": m.role, "name": m.name, "content": text})
    return "\n".join(lines), rows


def parse_sections(text: str) -> dict[str, Any] | None:
    """The four sections from a model's answer (JSON, possibly fenced), or None."""
    found = re.search(r"\{.*\}", text, re.DOTALL)
    if not found:
        return None
    try:
        value = json.loads(found.group(0))
    except ValueError:
        return None
    if not isinstance(value, dict) or not any(k in value for k in SECTIONS):
        return None
    sections: dict[str, Any] = {"intent": str(value.get("intent") or "")[:500]}
    for key in SECTIONS[1:]:
        items = value.get(key) or []
        if isinstance(items, str):
            items = [items]
        sections[key] = (
            [str(i)[:500] for i in items if str(i).strip()] if isinstance(items, list) else []
        )
    return sections


def render_summary(
    sections: dict[str, Any], tokens: int, tokenizer: Tokenizer | None = None
) -> str:
    """The summary as the model reads it, within `tokens` (as `tokenizer` counts them):
    the oldest actions go first, then open items; facts, the point of a summary, go last."""
    sections = {k: list(v) if isinstance(v, list) else v for k, v in sections.items()}

    def text() -> str:
        parts = [SUMMARY_HEADING]
        if sections.get("intent"):
            parts.append(f"User's intent: {sections['intent']}")
        for key, title in (
            ("facts", "Key facts and preferences"),
            ("actions", "Actions done"),
            ("open_items", "Open items"),
        ):
            if sections.get(key):
                parts.append(f"{title}:\n" + "\n".join(f"- {i}" for i in sections[key]))
        return "\n".join(parts)

    rendered = text()
    # Oldest actions go first; facts from the newest (the older ones are those a
    # rolling summary has carried forward every time: what the user said at the start).
    for key, at in (("actions", 0), ("open_items", 0), ("facts", -1)):
        while sections.get(key) and count_message_tokens(rendered, "", tokenizer) > tokens:
            sections[key].pop(at)
            rendered = text()
    return cap_text(rendered, max(tokens - 4, 1), tokenizer)


def summarise(
    *,
    session: Session,
    agent: Agent,
    messages: tuple[Message, ...],
    previous: Message | None,
    tokens: int,
    tokenizer: Tokenizer | None = None,
) -> SummaryOutcome:
    """Condense `messages` (and the previous summary) into a summary message of at most
    `tokens` (as `tokenizer`, the step's, counts them).

    1. A transcript of the messages (each cut to a few hundred characters).
    2. One call to the summary model, metered like any call (a ModelCall row
       with purpose "summary", committed with the step).
    3. The answer's sections (or, not JSON, its text) rendered within `tokens`.
    """
    if not messages:
        return SummaryOutcome()
    endpoint = summary_endpoint(agent)
    transcript, rows = _transcript(messages)
    prior = previous.data.get("sections") if previous is not None and previous.data else None
    window = min(endpoint.context_window, agent.context_window)
    # The summary model's request is counted with its own tokenizer.
    counter = endpoint_tokenizer(endpoint)
    room = max(
        window - SUMMARY_OUTPUT_TOKENS - count_message_tokens(INSTRUCTIONS, "", counter) - 64, 64
    )
    prompt = ""
    if prior:
        prompt += "Previous summary:\n" + json.dumps(prior, ensure_ascii=False) + "\n\n"
    prompt = cap_text(prompt + "Conversation to condense:\n" + transcript, room, counter)
    request = ChatRequest(
        messages=(
            ChatMessage(role="system", content=INSTRUCTIONS),
            ChatMessage(role="user", content=prompt, data={"previous": prior, "messages": rows}),
        ),
        tool_choice="none",
        max_tokens=SUMMARY_OUTPUT_TOKENS,
        agent_config={"task": "summary", "rules": [], "fallback_answer": ""},
    )
    connection.close()  # never hold a connection across a model call
    response, record = side_call(session, endpoint, request, purpose="summary")
    outcome = SummaryOutcome(calls=[record])
    if response is None or not response.text.strip():
        logger.warning(
            "summary failed: session=%s endpoint=%s, the history is trimmed instead",
            session.pk,
            endpoint.name,
        )
        return outcome
    sections = parse_sections(response.text)
    if sections is None:
        content = cap_text(
            f"{SUMMARY_HEADING}\n{response.text.strip()}", max(tokens - 4, 1), tokenizer
        )
    else:
        content = render_summary(sections, tokens, tokenizer)
    # The summary stands for everything up to the chunk's last message; an older
    # summary is never shown once a newer one exists, whatever its seq.
    seqs = [m.seq for m in messages if m.seq is not None]
    if not seqs:
        return outcome
    summary = Message(
        turn=session.turn,
        role="system",
        name=SUMMARY_NAME,
        content=content,
        data={
            "kind": "summary",
            "from_seq": min(seqs),
            "through_seq": max(seqs),
            "messages": len(messages),
            "model": endpoint.name,
            "sections": sections,
        },
    )
    summary.token_count = message_tokens(summary)
    outcome.message = summary
    return outcome
