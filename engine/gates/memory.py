"""Long-term memory in the engine: the block before each turn, the `remember` and
`recall` tools, and what is kept at the end of a turn.

The memory port knows nothing of sessions; this module reads the session (owner,
turn, archived messages) and calls it. Memory never fails a turn: an embeddings
endpoint that is down leaves the block empty, and `recall` falls back to full text.

Agent.memory (JSON, every key optional):
- enabled (true): place the owner's memory in the context before each turn;
- top_k (5): how many items; tags ([] = all): only items with these tags;
- min_similarity (0.1): items less similar to the user's message stay out;
- half_life_days (30): the time decay of an item's score;
- remember_phrases (true): "remember that ..." / "记住 ..." in a user message is stored;
- extraction (false): at the end of a turn, the agent's cheap model (else its model)
  lists what is worth keeping; with the offline `rules` model a deterministic extractor
  answers instead.
"""

import logging
import re
from dataclasses import dataclass
from typing import Any

from django.db import connection

from engine.gates.metering import model_credits_check, side_call_commit
from engine.model.calls import cheap_endpoint, side_call
from llm.types import ChatMessage, ChatRequest
from memory import extraction
from memory.embeddings import EmbeddingError, current_embedder, embed_texts
from memory.selectors import (
    memory_as_data,
    memory_block,
    memory_owner_has_items,
    memory_ranked,
    vector_literal,
)
from memory.services import memory_remember, memory_touch
from sessions.models import Agent, Message, ModelCall, Session, ToolCall, ToolCallStatus
from tools.builtin import MEMORY_HANDLERS, RECALL_HANDLER
from tools.execution import ToolOutcome, ToolSnapshot, validator_for
from tools.rendering import render_failure, render_success
from tools.validation import check_arguments

logger = logging.getLogger(__name__)
ARCHIVE_EMBED_BATCH = 200
RECALL_MESSAGES = 5
EXTRACTION = "extraction"  # the ModelCall purpose of the end-of-turn extraction
EXTRACTION_MAX_TOKENS = 600


@dataclass(frozen=True)
class MemorySettings:
    enabled: bool = True
    top_k: int = 5
    tags: tuple[str, ...] = ()
    min_similarity: float = 0.1
    half_life_days: float = 30.0
    remember_phrases: bool = True
    extraction: bool = False

    @classmethod
    def of(cls, agent: Agent) -> "MemorySettings":
        raw: dict[str, Any] = agent.memory if isinstance(agent.memory, dict) else {}
        try:
            return cls(
                enabled=bool(raw.get("enabled", True)),
                top_k=max(0, min(50, int(raw.get("top_k", 5)))),
                tags=tuple(str(t) for t in raw.get("tags") or ()),
                min_similarity=float(raw.get("min_similarity", 0.1)),
                half_life_days=float(raw.get("half_life_days", 30.0)),
                remember_phrases=bool(raw.get("remember_phrases", True)),
                extraction=bool(raw.get("extraction", False)),
            )
        except (TypeError, ValueError):
            logger.warning("agent %s has malformed memory settings; using defaults", agent.slug)
            return cls()


# --- Before a turn -------------------------------------------------------------


def turn_memory_block(session: Session, agent: Agent, history: list[Message]) -> str:
    """The owner's most relevant memory for this turn's user message, as a system block."""
    settings = MemorySettings.of(agent)
    if not settings.enabled or settings.top_k == 0:
        return ""
    query = next(
        (m.content for m in reversed(history) if m.role == "user" and m.turn == session.turn),
        "",
    )
    if not query.strip() or not memory_owner_has_items(session.owner_id):
        return ""
    try:
        embedder = current_embedder()
        vector = embed_texts([query[:4000]], embedder)[0]
        ranked = memory_ranked(
            owner_id=session.owner_id,
            vector=vector,
            model=embedder.model,
            k=settings.top_k,
            tags=settings.tags,
            min_similarity=settings.min_similarity,
            half_life_days=settings.half_life_days,
        )
    except EmbeddingError as exc:
        logger.warning("memory left out of session %s's turn: %s", session.pk, exc)
        return ""
    memory_touch(item_ids=[r.item.pk for r in ranked])
    return memory_block(ranked)


# --- The remember and recall tools ---------------------------------------------


def is_memory_call(call: ToolCall, tools: dict[str, ToolSnapshot]) -> bool:
    tool = tools.get(call.tool_name)
    return tool is not None and tool.handler in MEMORY_HANDLERS


def memory_tool_outcomes(
    session: Session, calls: list[ToolCall], tools: dict[str, ToolSnapshot]
) -> dict[int, ToolOutcome]:
    """Run this step's `remember` and `recall` calls (the others are left out)."""
    outcomes: dict[int, ToolOutcome] = {}
    for call in calls:
        if not is_memory_call(call, tools):
            continue
        tool = tools[call.tool_name]
        checked = check_arguments(validator_for(tool), call.input)
        if call.error or checked.errors:
            problems = call.error or "; ".join(checked.errors)
            message = f"invalid arguments for {tool.name}: {problems}. Fix them and call again."
            outcomes[call.pk] = ToolOutcome(
                status=ToolCallStatus.FAILED,
                output=None,
                error=message,
                content=render_failure("failed", message),
            )
            continue
        try:
            if tool.handler == RECALL_HANDLER:
                output = recall(session, str(checked.arguments["query"]))
            else:
                output = remember(session, call, checked.arguments)
        except EmbeddingError as exc:
            message = f"{tool.name} could not reach the embeddings service ({exc}); try later."
            outcomes[call.pk] = ToolOutcome(
                status=ToolCallStatus.FAILED,
                output=None,
                error=message,
                content=render_failure("failed", message),
            )
            continue
        outcomes[call.pk] = ToolOutcome(
            status=ToolCallStatus.SUCCESS, output=output, content=render_success(output)
        )
    return outcomes


def remember(session: Session, call: ToolCall, arguments: dict[str, Any]) -> dict[str, Any]:
    done = memory_remember(
        owner_id=session.owner_id,
        content=str(arguments["content"]),
        tag=str(arguments.get("tag") or "fact").lower(),
        importance=0.8,
        source="tool",
        source_session_id=session.pk,
        # The call's idempotency key: a step re-run after a crash finds its write.
        source_key=f"call:{call.idempotency_key}",
    )
    result: dict[str, Any] = {"stored": True, "action": done.action, "id": done.item.pk}
    if done.previous:
        result["replaces"] = done.previous
    return result


def recall(session: Session, query: str) -> dict[str, Any]:
    """Search the owner's memory and this session's archived messages.

    1. Memory items: the same ranking as the context block.
    2. Archived messages: embed any not yet embedded (lazily, a batch at a time),
       then the nearest ones by vector and the ones matching by full text, merged.
    """
    embedder = current_embedder()
    vector = embed_texts([query], embedder)[0]
    ranked = memory_ranked(
        owner_id=session.owner_id, vector=vector, model=embedder.model, k=5, min_similarity=0.05
    )
    _embed_archived(session, embedder)
    return {
        "memories": memory_as_data(ranked),
        "archived_messages": archived_matches(session, query, vector),
    }


def _embed_archived(session: Session, embedder: Any) -> None:
    pending = list(
        Message.objects.filter(session=session, archived_at__isnull=False, embedding__isnull=True)
        .exclude(content="")
        .order_by("seq")
        .values_list("pk", "content")[:ARCHIVE_EMBED_BATCH]
    )
    if not pending:
        return
    vectors = embed_texts([c[:4000] for _, c in pending], embedder)
    for (pk, _), vector in zip(pending, vectors, strict=True):
        Message.objects.filter(pk=pk).update(embedding=vector)


_WORD = re.compile(r"[^\W_]+", re.UNICODE)


def archived_matches(session: Session, query: str, vector: list[float]) -> list[dict[str, Any]]:
    """This session's archived messages nearest to the query, plus those sharing its words."""
    table = Message._meta.db_table
    dims = len(vector)
    words = [w for w in _WORD.findall(query.lower()) if len(w) > 2][:20]
    scores: dict[int, float] = {}
    with connection.cursor() as cursor:
        cursor.execute(
            # The table from model metadata; every value is a bound parameter.
            f'SELECT id, 1 - (embedding <=> %s::vector) FROM "{table}" '  # nosec B608
            "WHERE session_id = %s AND archived_at IS NOT NULL AND embedding IS NOT NULL "
            "AND vector_dims(embedding) = %s ORDER BY embedding <=> %s::vector LIMIT %s",
            [vector_literal(vector), session.pk, dims, vector_literal(vector), RECALL_MESSAGES],
        )
        for pk, similarity in cursor.fetchall():
            scores[pk] = float(similarity)
        if words:
            # Any of the words (an AND of all would miss most questions); ranked by ts_rank.
            cursor.execute(
                f"SELECT id, ts_rank(to_tsvector('simple', content), q) FROM \"{table}\", "  # nosec B608
                "to_tsquery('simple', %s) q WHERE session_id = %s AND archived_at IS NOT NULL "
                "AND to_tsvector('simple', content) @@ q ORDER BY 2 DESC LIMIT %s",
                [" | ".join(words), session.pk, RECALL_MESSAGES],
            )
            for pk, rank in cursor.fetchall():
                scores[pk] = scores.get(pk, 0.0) + 0.3 + min(0.5, float(rank))
    best = sorted(scores, key=lambda pk: -scores[pk])[:RECALL_MESSAGES]
    messages = Message.objects.in_bulk(best)
    return [
        {
            "seq": m.seq,
            "role": m.role,
            "content": m.content[:1000],
            "at": m.created_at.isoformat(),
        }
        for pk in best
        if (m := messages.get(pk)) is not None
    ]


# --- After a turn --------------------------------------------------------------


def wants_turn_memory(agent: Agent, user_text: str) -> bool:
    """Whether the end of this turn has memory work (checked before enqueuing it)."""
    settings = MemorySettings.of(agent)
    return settings.extraction or (
        settings.remember_phrases and extraction.asks_to_remember(user_text)
    )


def turn_memory_keep(*, session_id: str, turn: int) -> int:
    """Keep what a finished turn said worth keeping; the number of items written.

    1. "remember that ..." in the user's messages, stored as they said it.
    2. With extraction on: the cheap model (or the deterministic extractor for the
       offline rules model) lists items from the turn's messages.
    Each write's key names the turn, so a task run twice writes nothing twice.
    """
    session = Session.objects.select_related("agent__model", "agent__cheap_model").get(
        pk=session_id
    )
    agent = session.agent
    settings = MemorySettings.of(agent)
    messages = list(
        Message.objects.filter(session=session, turn=turn, role__in=["user", "assistant"])
        .exclude(content="")
        .order_by("seq")
    )
    user_texts = [m.content for m in messages if m.role == "user"]
    candidates: list[tuple[str, str, extraction.Candidate]] = []
    if settings.remember_phrases:
        for m in messages:
            if m.role == "user":
                for i, c in enumerate(extraction.explicit_requests(m.content)):
                    candidates.append((f"msg:{m.pk}:{i}", "user", c))
    if settings.extraction:
        for i, c in enumerate(_extract(session, turn, agent, messages, user_texts)):
            candidates.append((f"turn:{session.pk}:{turn}:{i}", "extraction", c))
    written = 0
    for key, source, c in candidates:
        try:
            memory_remember(
                owner_id=session.owner_id,
                content=c.content,
                tag=c.tag,
                subject=c.subject,
                importance=c.importance,
                confidence=0.9 if source == "user" else 0.6,
                source=source,
                source_session_id=session.pk,
                source_key=key,
            )
            written += 1
        except EmbeddingError as exc:
            logger.warning("memory of session %s turn %s not kept: %s", session.pk, turn, exc)
            break
    return written


def _extract(
    session: Session, turn: int, agent: Agent, messages: list[Message], user_texts: list[str]
) -> list[Any]:
    """The cheap model's list of what the turn is worth keeping, metered like a step's call.

    1. The offline rules model: the deterministic extractor, no call.
    2. Already recorded for this turn (the task ran before): no second call, no charge.
    3. A paid endpoint the owner's free points cannot cover: skipped, never run on credit.
    4. The call (no connection held across it), then its row, rollup and charge committed
       in a short transaction of their own (`side_call_commit`).
    """
    endpoint = cheap_endpoint(agent)
    if endpoint.api == "rules":
        return extraction.rule_extract(user_texts)
    if ModelCall.objects.filter(session=session, turn=turn, purpose=EXTRACTION).exists():
        return []
    transcript = "\n".join(f"{m.role}: {m.content[:2000]}" for m in messages)
    request = ChatRequest(
        messages=(
            ChatMessage(role="system", content=extraction.EXTRACTION_PROMPT),
            ChatMessage(role="user", content=transcript),
        ),
        tool_choice="none",
        temperature=0,
        max_tokens=EXTRACTION_MAX_TOKENS,
    )
    check = model_credits_check(session, endpoint, request, EXTRACTION_MAX_TOKENS)
    if check is not None and check.outcome == "insufficient":
        logger.info(
            "memory extraction of session %s turn %s skipped: %s (%s points needed, %s left)",
            session.pk,
            turn,
            check.reason,
            check.points,
            check.points_left,
        )
        return []
    connection.close()  # no connection held across the model call
    response, record = side_call(session, endpoint, request, purpose="extraction")
    record.turn = turn
    if not side_call_commit(session=session, record=record):
        return []  # a concurrent run of the task recorded (and keeps) this turn's items
    if response is None:
        logger.warning("memory extraction with %s failed: %s", endpoint.name, record.error)
        return []
    return extraction.parse_extraction(response.text)
