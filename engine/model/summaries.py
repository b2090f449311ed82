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

Ahead of need: past the 60% watermark (`summarise_ahead_at`), the step that
commits enqueues a task (engine/phases/after_turn.py) that makes the summary in
the background and keeps it as the session's `SummaryDraft`; the step that
reaches 90% turns a ready draft into its summary message without a model call
(`summary_draft_use`), and only summarises inline when there is none.

The summary model: `Agent.summary_model`, else the cheap model, else the
fallback, else the agent's own. The offline `rules` model answers with a
deterministic extract (llm/rules.py), so the demo summarises offline.
"""

import json
import logging
import re
import textwrap
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from django.db import connection
from django.db.models import Q
from django.utils import timezone

from engine.model.calls import endpoint_tokenizer, first_enabled_endpoint, side_call
from engine.model.context import (
    SUMMARY_HEADING,
    SUMMARY_NAME,
    Assembly,
    cap_text,
    message_tokens,
)
from llm.types import ChatMessage, ChatRequest
from memory.tokens import Tokenizer, count_message_tokens, count_tokens
from record.models import (
    Agent,
    Message,
    ModelCall,
    ModelCallOutcome,
    ModelEndpoint,
    Session,
    SummaryDraft,
)

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
# The longest item of a section kept.
FACT_CHARS = 500
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


def _line(m: Message) -> tuple[str, dict[str, Any]]:
    """One message as the summary model reads it, cut to a few hundred characters."""
    text = m.content
    if m.role == "assistant" and m.tool_calls:
        calls = ", ".join(
            f"{c.get('name')}({json.dumps(c.get('arguments') or {}, ensure_ascii=False)})"
            for c in m.tool_calls
        )
        text = f"{text} [called {calls}]".strip()
    who = f"tool {m.name}" if m.role == "tool" else m.role
    text = text[:TRANSCRIPT_MESSAGE_CHARS]
    return f"{who}: {text}", {"role": m.role, "name": m.name, "content": text}


def fitted_transcript(
    messages: tuple[Message, ...], room: int, counter: Tokenizer | None = None
) -> tuple[str, list[dict[str, Any]], tuple[Message, ...]]:
    """The transcript of the oldest messages that fit in `room` tokens (as the summary
    model's `counter` counts them), and those messages.

    The summary stands for exactly what the summary model read, so the
    transcript is never cut mid-message: it ends before the first message that
    does not fit, and never between an assistant's tool call and its results
    (archiving the call without its results would leave orphan results in the
    context). The rest stays in the context for the next summary. When not even
    the first unit (a message, or a tool call with its results) fits, it goes
    alone, capped to `room`.
    """
    lines: list[str] = []
    rows: list[dict[str, Any]] = []
    used = 0
    sent = 0  # how many messages went into the transcript
    cut = 0  # the last place the transcript may end: after `cut` messages
    for index, m in enumerate(messages):
        line, row = _line(m)
        tokens = count_tokens(line + "\n", counter)
        if used + tokens > room:
            break
        lines.append(line)
        rows.append(row)
        used += tokens
        sent = index + 1
        nxt = messages[index + 1] if index + 1 < len(messages) else None
        if nxt is None or nxt.role != "tool":
            cut = sent
    if not cut:
        # Not even the first unit fits: it goes alone (a tool call with its results), capped.
        unit = 1
        while unit < len(messages) and messages[unit].role == "tool":
            unit += 1
        first = [_line(m) for m in messages[:unit]]
        text = cap_text("\n".join(line for line, _ in first), room, counter)
        return text, [row for _, row in first], messages[:unit]
    return "\n".join(lines[:cut]), rows[:cut], messages[:cut]


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
    sections: dict[str, Any] = {"intent": str(value.get("intent") or "")[:FACT_CHARS]}
    for key in SECTIONS[1:]:
        items = value.get(key) or []
        if isinstance(items, str):
            items = [items]
        sections[key] = (
            [str(i)[:FACT_CHARS] for i in items if str(i).strip()]
            if isinstance(items, list)
            else []
        )
    return sections


def prose_sections(text: str) -> dict[str, Any]:
    """A prose answer kept as the summary's facts: one per line (long lines wrapped)."""
    facts: list[str] = []
    for line in text.strip().splitlines():
        line = line.strip().lstrip("-*• ").strip()
        if line and not line.startswith("```"):
            facts += textwrap.wrap(line, FACT_CHARS) or [line[:FACT_CHARS]]
    return {"intent": "", "facts": facts, "actions": [], "open_items": []}


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

    1. A transcript of the oldest messages that fit the summary model's window
       (each cut to a few hundred characters; `fitted_transcript`): the summary
       covers those only, the rest stays in the context.
    2. One call to the summary model, metered like any call (a ModelCall row
       with purpose "summary", committed with the step).
    3. The answer's sections (or, not JSON, its prose as the facts) rendered within `tokens`.
    """
    if not messages:
        return SummaryOutcome()
    endpoint = summary_endpoint(agent)
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
    prompt = cap_text(prompt, max(room // 2, 1), counter) + "Conversation to condense:\n"
    transcript, rows, messages = fitted_transcript(
        messages, max(room - count_tokens(prompt, counter), 16), counter
    )
    prompt += transcript
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
    # Prose instead of the JSON asked for is still a summary: it becomes the facts,
    # so the next summary merges it like any other (nothing the model said is lost).
    sections = parse_sections(response.text) or prose_sections(response.text)
    content = render_summary(sections, tokens, tokenizer)
    # The summary stands for the messages the summary model read (the transcript
    # may have stopped short of the chunk); an older summary is never shown once
    # a newer one exists, whatever its seq.
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


# A claim on a session's draft older than this is taken to be a task that died.
DRAFT_CLAIM_STALE_S = 300


def summary_base(previous: Message | None) -> int:
    """The last seq the latest summary covers (0: none): what a draft extends."""
    if previous is None or not isinstance(previous.data, dict):
        return 0
    through = previous.data.get("through_seq")
    return through if isinstance(through, int) else 0


def summary_ahead_wanted(session: Session, assembly: Assembly) -> bool:
    """Should a summary be prepared in the background after this step commits?

    Only past the ahead watermark; not when a draft for the current summary is ready or
    being made (a fresh claim), nor while failed summaries' wait runs.
    """
    if not assembly.ahead:
        return False
    now = timezone.now()
    row = (
        SummaryDraft.objects.filter(session_id=session.pk)
        .values("ready", "base_through", "claimed_at")
        .first()
    )
    if row is not None:
        if row["ready"] and row["base_through"] == summary_base(assembly.previous_summary):
            return False
        claimed = row["claimed_at"]
        if claimed is not None and claimed > now - timedelta(seconds=DRAFT_CLAIM_STALE_S):
            return False
    retry_at = summary_retry_at(session)
    return retry_at is None or now >= retry_at


def summary_draft_use(session: Session, assembly: Assembly, tokens: int) -> Message | None:
    """The ready draft as this step's summary message, if it still fits; else None.

    It must extend the latest summary, start where the chunk to summarise starts (the
    oldest message not summarised yet), end within that chunk and fit `tokens`.
    """
    base = summary_base(assembly.previous_summary)
    draft = SummaryDraft.objects.filter(
        session_id=session.pk, ready=True, base_through=base
    ).first()
    chunk = [m.seq for m in assembly.summarise if m.seq is not None]
    if draft is None or not chunk or not isinstance(draft.data, dict):
        return None
    if draft.from_seq != min(chunk) or draft.through_seq > max(chunk) or draft.token_count > tokens:
        return None
    return Message(
        turn=session.turn,
        role="system",
        name=SUMMARY_NAME,
        content=draft.content,
        data={**draft.data, "prepared": True},
        token_count=draft.token_count,
    )


def summary_draft_claim(session_id: UUID | str, base: int) -> datetime | None:
    """Claim the session's draft for making it (the claim's time is its token); None when a
    draft for `base` is ready already or another task holds a fresh claim."""
    now = timezone.now()
    SummaryDraft.objects.get_or_create(session_id=session_id)
    claimed = (
        SummaryDraft.objects.filter(session_id=session_id)
        .filter(
            Q(claimed_at__isnull=True)
            | Q(claimed_at__lt=now - timedelta(seconds=DRAFT_CLAIM_STALE_S))
        )
        .exclude(ready=True, base_through=base)
        .update(claimed_at=now, ready=False)
    )
    return now if claimed == 1 else None


def summary_draft_store(
    session_id: UUID | str, claim: datetime, base: int, message: Message
) -> bool:
    """Keep the made summary as the ready draft, if the claim is still ours."""
    data = message.data if isinstance(message.data, dict) else {}
    return (
        SummaryDraft.objects.filter(session_id=session_id, claimed_at=claim).update(
            claimed_at=None,
            ready=True,
            base_through=base,
            from_seq=int(data.get("from_seq") or 0),
            through_seq=int(data.get("through_seq") or 0),
            content=message.content,
            data=data,
            token_count=message.token_count,
        )
        == 1
    )


def summary_draft_release(session_id: UUID | str, claim: datetime) -> None:
    SummaryDraft.objects.filter(session_id=session_id, claimed_at=claim).update(claimed_at=None)
