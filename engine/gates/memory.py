"""Long-term memory in the engine: the block before each turn, the `remember` and
`recall` tools, and what is kept at the end of a turn.

The memory port knows nothing of sessions; this module reads the session (owner,
turn) and asks it; it writes nothing, of the record or of memory: the items a turn's
block uses are marked by the model phase (`MemoryBlock.used`), the `remember` and `recall` tools run
in the tool phase (engine/phases/memory_tools.py), and what a turn decided to keep is
written by engine/phases/after_turn.py `turn_memory_keep`. Memory never fails a turn: an embeddings
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
from dataclasses import dataclass
from typing import Any

from django.db import connection

from engine.model.calls import cheap_endpoint, side_call
from engine.model.credits import model_credits_check
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
from memory.selectors import (
    memory_block,
    memory_neighbours,
    memory_owner_has_items,
    memory_ranked,
    memory_written_since,
)
from record.models import Agent, Message, ModelCall, Session
from tools.builtin import RECALL, REMEMBER

logger = logging.getLogger(__name__)
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


@dataclass(frozen=True)
class MemoryBlock:
    """The memory placed before a turn: the system block, and the items in it, which the
    model phase marks as used (memory.services.memory_touch; a gate writes nothing)."""

    text: str = ""
    used: tuple[int, ...] = ()


def turn_memory_block(
    session: Session, agent: Agent, history: list[Message], has_items: bool | None = None
) -> MemoryBlock:
    """The owner's most relevant memory for this turn's user message, as a system block.

    `has_items`: whether the owner has live items, if the run read it already (the lease's
    round trip); else asked here."""
    settings = MemorySettings.of(agent)
    if not settings.enabled or settings.top_k == 0:
        return MemoryBlock()
    query = next(
        (m.content for m in reversed(history) if m.role == "user" and m.turn == session.turn),
        "",
    )
    if not query.strip():
        return MemoryBlock()
    if not (has_items if has_items is not None else memory_owner_has_items(session.owner_id)):
        return MemoryBlock()
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
        return MemoryBlock()
    return MemoryBlock(text=memory_block(ranked), used=tuple(r.item.pk for r in ranked))


# --- After a turn --------------------------------------------------------------


def wants_turn_memory(agent: Agent, user_text: str) -> bool:
    """Whether the end of this turn has memory work (checked before enqueuing it)."""
    settings = MemorySettings.of(agent)
    return settings.extraction or (
        settings.remember_phrases and extraction.asks_to_remember(user_text)
    )


def explicit_keeps(messages: list[Message]) -> list[tuple[str, extraction.Candidate]]:
    """ "remember that ..." in the turn's user messages, as they said it: each with its
    write's key (the message and the position: a task run twice writes nothing twice)."""
    return [
        (f"msg:{m.pk}:{i}", c)
        for m in messages
        if m.role == "user"
        for i, c in enumerate(extraction.explicit_requests(m.content))
    ]


def extraction_changes(
    decided: "Decided", session_id: Any, turn: int, user_texts: list[str]
) -> tuple[list[tuple[str, extraction.Candidate, Decision | None]], list[tuple[str, Decision]]]:
    """What the extraction decided, as writes (key, candidate, decision) and deletes (key,
    decision): the model's decisions, else the rules' extraction of the user's texts."""
    writes: list[tuple[str, extraction.Candidate, Decision | None]] = []
    deletes: list[tuple[str, Decision]] = []
    if decided.decisions is None:  # no model, or no valid answer: the rules extract and decide
        for i, c in enumerate(extraction.rule_extract(user_texts)):
            writes.append((f"turn:{session_id}:{turn}:{i}", c, None))
        return writes, deletes
    for i, d in enumerate(decided.decisions):
        key = f"turn:{session_id}:{turn}:{i}"
        if d.action == "delete" and d.target is not None:
            deletes.append((key, d))
        elif d.action in ("add", "update"):
            importance = d.importance if d.importance is not None else 0.6
            tag = d.tag or extraction.tag_of(d.content)
            writes.append((key, extraction.Candidate(d.content, tag, d.subject, importance), d))
    return writes, deletes


@dataclass(frozen=True)
class Decided:
    """What the turn's extraction decided, and the call that decided it (not yet committed)."""

    decisions: list[Decision] | None  # None: the rules extract and decide
    decided_by: str = "rules"
    record: ModelCall | None = None
    done: bool = False  # this turn's call is recorded already: nothing to do


def extraction_decide(
    session: Session, turn: int, agent: Agent, messages: list[Message], user_texts: list[str]
) -> "Decided":
    """The cheap model's decisions for the turn; the rules' when there is no valid answer.

    1. The offline rules model: the rules, no call.
    2. Already recorded for this turn (the task ran before): no second call, no charge,
       nothing applied twice.
    3. The owner's nearest live memories to the turn's user messages (embedded outside
       any transaction), shown with their ids.
    4. A paid endpoint the owner's free points cannot cover: the rules, never run on credit.
    5. The call (no connection held across it), asking for DECISIONS_SCHEMA as structured
       output where the wire has it. Its record is returned uncommitted: the phase
       commits it with the writes (engine/phases/after_turn.py).
    6. The answer validated (memory/decision.py): invalid, or a failed call, the rules.
    """
    endpoint = cheap_endpoint(agent)
    if endpoint.api == "rules":
        return Decided(None)
    if ModelCall.objects.filter(session=session, turn=turn, purpose=EXTRACTION).exists():
        return Decided([], done=True)
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
        return Decided(None)
    connection.close()  # no connection held across the model call
    response, record = side_call(session, endpoint, request, purpose="extraction")
    record.turn = turn
    if response is None:
        logger.warning("memory extraction with %s failed: %s", endpoint.name, record.error)
        return Decided(None, record=record)
    decisions, problem = parse_decisions(response.text, {n.id for n in neighbours})
    if decisions is None:
        logger.warning(
            "memory extraction with %s answered invalid JSON (%s); the rules decide",
            endpoint.name,
            problem,
        )
        return Decided(None, record=record)
    return Decided(decisions, f"model:{endpoint.name}", record)
