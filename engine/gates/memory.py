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
- extraction (on for an agent with memory: one that lists `remember` or `recall`, or
  has a `memory` setting; off for the others): at the end of a turn, one call to the
  agent's cheap model (else its model) is shown the owner's nearest memories and the
  turn, and answers what to add, update, delete or keep (memory/decision.py); with the
  offline `rules` model, or when the call fails or answers invalid JSON, the rules
  extract and decide instead.
"""

import logging
import re
from dataclasses import dataclass
from typing import Any

from django.db import connection, transaction

from engine.gates.metering import model_credits_check, side_call_charges
from engine.model.calls import cheap_endpoint, side_call
from engine.store.side_calls import side_call_commit
from llm.types import ChatMessage, ChatRequest, ResponseFormat
from memory import extraction
from memory.decision import (
    DECISION_PROMPT,
    DECISIONS_SCHEMA,
    Decision,
    Neighbour,
    decision_input,
    parse_decisions,
)
from memory.embeddings import EmbeddingError, current_embedder, embed_texts
from memory.models import VersionActor
from memory.selectors import (
    memory_as_data,
    memory_block,
    memory_neighbours,
    memory_owner_has_items,
    memory_ranked,
    memory_written_since,
    vector_literal,
)
from memory.services import Remembered, memory_forget, memory_remember, memory_touch
from record.models import Agent, Message, ModelCall, Session, ToolCall, ToolCallStatus
from tools.builtin import MEMORY_HANDLERS, RECALL, RECALL_HANDLER, REMEMBER
from tools.execution import ToolOutcome, ToolSnapshot, validator_for
from tools.rendering import render_failure, render_success
from tools.validation import check_arguments

logger = logging.getLogger(__name__)
ARCHIVE_EMBED_BATCH = 200
RECALL_MESSAGES = 5
EXTRACTION = "extraction"  # the ModelCall purpose of the end-of-turn extraction
EXTRACTION_MAX_TOKENS = 600
EXTRACTION_NEIGHBOURS = 10  # the owner's nearest live items the extraction call is shown
WRITTEN_NEIGHBOURS = 3  # and, for each item written during the turn, its nearest


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
        # An agent with memory (it lists the memory tools, or has memory settings) keeps
        # what its turns say unless told not to; one without pays for no extraction.
        has_memory = bool(raw) or bool({REMEMBER, RECALL} & set(agent.tools or ()))
        try:
            return cls(
                enabled=bool(raw.get("enabled", True)),
                top_k=max(0, min(50, int(raw.get("top_k", 5)))),
                tags=tuple(str(t) for t in raw.get("tags") or ()),
                min_similarity=float(raw.get("min_similarity", 0.1)),
                half_life_days=float(raw.get("half_life_days", 30.0)),
                remember_phrases=bool(raw.get("remember_phrases", True)),
                extraction=bool(raw.get("extraction", has_memory))
                and bool(raw.get("enabled", True)),
            )
        except (TypeError, ValueError):
            logger.warning("agent %s has malformed memory settings; using defaults", agent.slug)
            return cls()


# --- Before a turn -------------------------------------------------------------


def turn_memory_block(
    session: Session, agent: Agent, history: list[Message], has_items: bool | None = None
) -> str:
    """The owner's most relevant memory for this turn's user message, as a system block.

    `has_items`: whether the owner has live items, if the run read it already (the lease's
    round trip); else asked here."""
    settings = MemorySettings.of(agent)
    if not settings.enabled or settings.top_k == 0:
        return ""
    query = next(
        (m.content for m in reversed(history) if m.role == "user" and m.turn == session.turn),
        "",
    )
    if not query.strip():
        return ""
    if not (has_items if has_items is not None else memory_owner_has_items(session.owner_id)):
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
    """Apply the model's `remember` by the rules (no second model call inside a step): its
    `subject`, when given, names what it replaces. The turn's extraction call sees the
    result among the owner's memories and may still correct it."""
    done = memory_remember(
        owner_id=session.owner_id,
        content=str(arguments["content"]),
        tag=str(arguments.get("tag") or "fact").lower(),
        subject=str(arguments.get("subject") or ""),
        importance=0.8,
        source=VersionActor.TOOL,
        source_session_id=session.pk,
        # The call's idempotency key: a step re-run after a crash finds its write.
        source_key=f"call:{call.idempotency_key}",
        actor_ref=f"call:{call.idempotency_key}",
    )
    result: dict[str, Any] = {
        "stored": True,
        "action": done.action,
        "id": done.item.pk,
        "subject": done.item.subject,
    }
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
    """Keep what a finished turn said worth keeping; the number of changes made.

    1. "remember that ..." in the user's messages, stored as they said it (the rules
       decide what it replaces).
    2. With extraction on: one call to the cheap model, shown the owner's nearest
       memories (those of step 1 included) and the turn, answers add / update / delete /
       keep entries, each applied under the owner's lock. The offline rules model, a
       call that fails or an invalid answer: the deterministic extractor, decided by the
       rules.
    Each write's key names the turn, so a task run twice writes nothing twice.
    """
    session = Session.objects.select_related("agent__model", "agent__cheap_model").get(
        pk=session_id
    )
    if session.evaluation_id is not None:
        return 0  # an evaluation's replay keeps nothing: its memory writes would be side effects
    agent = session.agent
    settings = MemorySettings.of(agent)
    messages = list(
        Message.objects.filter(session=session, turn=turn, role__in=["user", "assistant"])
        .exclude(content="")
        .order_by("seq")
    )
    written = 0
    try:
        if settings.remember_phrases:
            for m in messages:
                if m.role != "user":
                    continue
                for i, c in enumerate(extraction.explicit_requests(m.content)):
                    key = f"msg:{m.pk}:{i}"
                    done = _keep(session, c, key, VersionActor.USER, confidence=0.9)
                    written += done.action != "unchanged"
        if settings.extraction:
            written += _extract_and_apply(session, turn, agent, messages)
    except EmbeddingError as exc:
        logger.warning("memory of session %s turn %s not kept: %s", session.pk, turn, exc)
    return written


def _keep(
    session: Session,
    candidate: extraction.Candidate,
    key: str,
    actor: str,
    *,
    confidence: float,
    decision: Decision | None = None,
    decided_by: str = "rules",
) -> Remembered:
    return memory_remember(
        owner_id=session.owner_id,
        content=candidate.content,
        tag=candidate.tag,
        subject=candidate.subject,
        importance=candidate.importance,
        confidence=confidence,
        source=actor,
        source_session_id=session.pk,
        source_key=key,
        decision=decision,
        decided_by=decided_by,
    )


def _extract_and_apply(session: Session, turn: int, agent: Agent, messages: list[Message]) -> int:
    """Step 2 of turn_memory_keep: the model's decisions, else the rules'; changes made.

    1. Decide: the cheap model (one call), else the rules (`_decide_by_model`).
    2. Embed every text to be written, outside any transaction: the vectors land in the
       embedding cache, so the writes below make no HTTP call under a lock.
    3. In one transaction: the call's record (row, rollups, charge) and every write it
       decided. A task that dies before this commits leaves neither, and its retry calls
       again; one that dies after finds the record and does nothing. The turn is kept
       exactly once.
    """
    user_texts = [m.content for m in messages if m.role == "user"]
    decided = _decide_by_model(session, turn, agent, messages, user_texts)
    if decided.done:
        return 0
    writes: list[tuple[str, extraction.Candidate, Decision | None]] = []
    deletes: list[tuple[str, Decision]] = []
    if decided.decisions is None:  # no model, or no valid answer: the rules extract and decide
        for i, c in enumerate(extraction.rule_extract(user_texts)):
            writes.append((f"turn:{session.pk}:{turn}:{i}", c, None))
    else:
        for i, d in enumerate(decided.decisions):
            key = f"turn:{session.pk}:{turn}:{i}"
            if d.action == "delete" and d.target is not None:
                deletes.append((key, d))
            elif d.action in ("add", "update"):
                importance = d.importance if d.importance is not None else 0.6
                tag = d.tag or extraction.tag_of(d.content)
                writes.append((key, extraction.Candidate(d.content, tag, d.subject, importance), d))
    try:
        if writes:
            embed_texts([c.content for _, c, _ in writes], current_embedder())
    except EmbeddingError:
        if decided.record is not None:  # the call was made: metered, whatever comes of it
            side_call_commit(
                session=session,
                record=decided.record,
                charges=side_call_charges(session, decided.record),
            )
        raise
    written = 0
    with transaction.atomic():
        if decided.record is not None and not side_call_commit(
            session=session,
            record=decided.record,
            charges=side_call_charges(session, decided.record),
        ):
            return 0  # a concurrent run of the task recorded (and keeps) this turn's
        for key, d in deletes:
            gone = memory_forget(
                owner_id=session.owner_id, item_id=d.target or 0, reason=d.reason,
                source=VersionActor.EXTRACTION, source_session_id=session.pk, source_key=key,
                decided_by=decided.decided_by,
            )  # fmt: skip
            written += gone is not None
        for key, candidate, decision in writes:
            done = _keep(
                session, candidate, key, VersionActor.EXTRACTION, confidence=0.6,
                decision=decision, decided_by=decided.decided_by,
            )  # fmt: skip
            written += done.action != "unchanged"
    return written


@dataclass(frozen=True)
class _Decided:
    """What the turn's extraction decided, and the call that decided it (not yet committed)."""

    decisions: list[Decision] | None  # None: the rules extract and decide
    decided_by: str = "rules"
    record: ModelCall | None = None
    done: bool = False  # this turn's call is recorded already: nothing to do


def _decide_by_model(
    session: Session, turn: int, agent: Agent, messages: list[Message], user_texts: list[str]
) -> _Decided:
    """The cheap model's decisions for the turn; the rules' when there is no valid answer.

    1. The offline rules model: the rules, no call.
    2. Already recorded for this turn (the task ran before): no second call, no charge,
       nothing applied twice.
    3. The owner's nearest live memories to the turn's user messages (embedded outside
       any transaction), shown with their ids.
    4. A paid endpoint the owner's free points cannot cover: the rules, never run on credit.
    5. The call (no connection held across it), asking for DECISIONS_SCHEMA as structured
       output where the wire has it. Its record is returned uncommitted: the caller
       commits it with the writes (`side_call_commit`).
    6. The answer validated (memory/decision.py): invalid, or a failed call, the rules.
    """
    endpoint = cheap_endpoint(agent)
    if endpoint.api == "rules":
        return _Decided(None)
    if ModelCall.objects.filter(session=session, turn=turn, purpose=EXTRACTION).exists():
        return _Decided([], done=True)
    query = "\n".join(user_texts)[:4000]
    neighbours: list[Neighbour] = []
    fresh: set[int] = set()
    if query.strip() and memory_owner_has_items(session.owner_id):
        embedder = current_embedder()
        vector = embed_texts([query], embedder)[0]
        neighbours, _ = memory_neighbours(
            owner_id=session.owner_id, vector=vector, model=embedder.model,
            k=EXTRACTION_NEIGHBOURS,
        )  # fmt: skip
        # What this turn's `remember` calls and "remember that ..." wrote, with their own
        # neighbours: the model reviews those writes too.
        written, fresh = memory_written_since(
            owner_id=session.owner_id, session_id=session.pk, since=messages[0].created_at,
            k=WRITTEN_NEIGHBOURS,
        ) if messages else ([], set())  # fmt: skip
        shown = {n.id for n in neighbours}
        neighbours += [n for n in written if n.id not in shown]
    transcript = "\n".join(f"{m.role}: {m.content[:2000]}" for m in messages)
    request = ChatRequest(
        messages=(
            ChatMessage(role="system", content=DECISION_PROMPT),
            ChatMessage(
                role="user", content=decision_input(neighbours, transcript, frozenset(fresh))
            ),
        ),
        tool_choice="none",
        temperature=0,
        max_tokens=EXTRACTION_MAX_TOKENS,
        response_format=ResponseFormat(schema=DECISIONS_SCHEMA, name="memory_updates"),
    )
    check = model_credits_check(session, endpoint, request, EXTRACTION_MAX_TOKENS)
    if check is not None and check.outcome == "insufficient":
        logger.info(
            "memory extraction of session %s turn %s by the rules: %s (%s points needed, %s left)",
            session.pk,
            turn,
            check.reason,
            check.points,
            check.points_left,
        )
        return _Decided(None)
    connection.close()  # no connection held across the model call
    response, record = side_call(session, endpoint, request, purpose="extraction")
    record.turn = turn
    if response is None:
        logger.warning("memory extraction with %s failed: %s", endpoint.name, record.error)
        return _Decided(None, record=record)
    decisions, problem = parse_decisions(response.text, {n.id for n in neighbours})
    if decisions is None:
        logger.warning(
            "memory extraction with %s answered invalid JSON (%s); the rules decide",
            endpoint.name,
            problem,
        )
        return _Decided(None, record=record)
    return _Decided(decisions, f"model:{endpoint.name}", record)
