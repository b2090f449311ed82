"""The `remember` and `recall` tools, run in the tool phase (they need the session's owner
and id): `remember` writes through the memory port by the rules (no second model call
inside a step), `recall` searches the owner's memory and the session's archived messages,
embedding any archived message not yet embedded. Memory never fails a turn: an embeddings
endpoint that is down fails the call, and the model reads why."""

import re
from typing import Any

from django.db import connection

from memory.embeddings import EmbeddingError, current_embedder, embed_texts
from memory.models import VersionActor
from memory.selectors import memory_as_data, memory_ranked, vector_literal
from memory.services import memory_remember
from record.models import Message, Session, ToolCall, ToolCallStatus
from tools.builtin import MEMORY_HANDLERS, RECALL_HANDLER
from tools.execution import ToolOutcome, ToolSnapshot, validator_for
from tools.rendering import render_failure, render_success
from tools.validation import check_arguments

ARCHIVE_EMBED_BATCH = 200
RECALL_MESSAGES = 5


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
            outcomes[call.pk] = _failed(
                f"invalid arguments for {tool.name}: {problems}. Fix them and call again."
            )
            continue
        try:
            if tool.handler == RECALL_HANDLER:
                output = recall(session, str(checked.arguments["query"]))
            else:
                output = remember(session, call, checked.arguments)
        except EmbeddingError as exc:
            outcomes[call.pk] = _failed(
                f"{tool.name} could not reach the embeddings service ({exc}); try later."
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


def _failed(message: str) -> ToolOutcome:
    """A call the model can correct: the message says what to do."""
    return ToolOutcome(
        status=ToolCallStatus.FAILED,
        output=None,
        error=message,
        content=render_failure("failed", message),
    )
