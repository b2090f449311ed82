"""What runs after a step or a turn, off its critical path, each from its own task: a
summary made ahead of need, and what a finished turn said worth keeping in memory. Each
calls a model outside a step and commits it in a short transaction of its own
(engine/store/side_calls.py `side_call_commit`), with the writes it decided.

Summaries ahead (README "Context budget and summaries"): a step whose history passed
`summarise_ahead_at` (60% of the history partition, after trimming) enqueues
`sessions.tasks.summarise_ahead` once it has committed. The task makes the summary the
step at `summarise_at` (90%) would otherwise make inline, and keeps it as the session's
`SummaryDraft`; that step uses it without a model call (engine/model/summaries.py
`summary_draft_use`).

Memory (engine/gates/memory.py decides what to keep; this module writes it).
"""

import logging
from datetime import datetime

from django.db import transaction

from engine.gates.memory import (
    MemorySettings,
    explicit_keeps,
    extraction_changes,
    extraction_decide,
)
from engine.model.calls import request_tokenizer, request_window
from engine.model.context import assemble
from engine.model.credits import model_credits_check
from engine.model.summaries import (
    SUMMARY_OUTPUT_TOKENS,
    summarise,
    summary_base,
    summary_draft_claim,
    summary_draft_release,
    summary_draft_store,
    summary_endpoint,
)
from engine.moves.metering import side_call_charges
from engine.store.side_calls import side_call_commit
from llm.types import ChatMessage, ChatRequest
from memory import extraction
from memory.decision import Decision
from memory.embeddings import EmbeddingError, current_embedder, embed_texts
from memory.models import VersionActor
from memory.services import Remembered, memory_forget, memory_remember
from record.models import Agent, Message, MessageStatus, ModelCall, Session
from tools.execution import tools_for_agent

logger = logging.getLogger(__name__)


def summary_ahead_make(*, session_id: str) -> bool:
    """Make the session's next summary and keep it ready; True when a draft was stored.

    Idempotent (a task delivered twice, or enqueued by two steps, does the work once):
    1. The history as a step reads it (unarchived, the latest summary at its head),
       assembled with the agent's tools: the oldest third to summarise (nothing once
       the history is back under the watermark: done).
    2. Claim the session's draft: none when one for the latest summary is ready or
       another task holds a fresh claim.
    3. At most one summary call per turn (a re-run pays nothing twice), and never on
       credit the owner's points cannot cover.
    4. The call (no connection held), then its ModelCall row metered and charged like a
       step's (`side_call_commit`); a failed one is recorded too, so failed summaries'
       wait (`summary_retry_at`) applies to the step's inline summary as well.
    5. The summary kept as the ready draft, if the claim is still ours.
    """
    session = Session.objects.select_related(
        "agent__model", "agent__fallback_model", "agent__summary_model", "agent__cheap_model"
    ).get(pk=session_id)
    agent = session.agent
    history = list(
        Message.objects.filter(
            session=session, status=MessageStatus.FINAL, seq__isnull=False, archived_at__isnull=True
        ).order_by("seq")
    )
    assembly = assemble(
        agent=agent,
        history=history,
        tools=tools_for_agent(agent.tools, session.role),
        final=False,
        window=request_window(agent, session),
        tokenizer=request_tokenizer(agent, session),
    )
    chunk = assembly.summarise or assembly.ahead
    if not chunk:
        return False
    base = summary_base(assembly.previous_summary)
    claim = summary_draft_claim(session.pk, base)
    if claim is None:
        return False
    try:
        stored = _make(session, assembly.previous_summary, chunk, assembly.usage, base, claim)
    finally:
        # Whatever happened (stored or not), the claim is not held past this task.
        summary_draft_release(session.pk, claim)
    return stored


def _make(
    session: Session,
    previous: Message | None,
    chunk: tuple[Message, ...],
    usage: dict[str, int],
    base: int,
    claim: datetime,
) -> bool:
    agent = session.agent
    if ModelCall.objects.filter(session=session, turn=session.turn, purpose="summary").exists():
        return False
    endpoint = summary_endpoint(agent)
    if endpoint.api != "rules":
        # Points for the answer at least: a summary is never made on credit.
        probe = ChatRequest(messages=(ChatMessage(role="user", content=""),))
        check = model_credits_check(session, endpoint, probe, SUMMARY_OUTPUT_TOKENS)
        if check is not None and check.outcome == "insufficient":
            logger.info("summary ahead of session %s skipped: %s", session.pk, check.reason)
            return False
    outcome = summarise(
        session=session,
        agent=agent,
        messages=chunk,
        previous=previous,
        tokens=max(usage["history_limit"] // 4, 64),
        tokenizer=request_tokenizer(agent, session),
    )
    for record in outcome.calls:
        record.turn = session.turn
        if not side_call_commit(
            session=session, record=record, charges=side_call_charges(session, record)
        ):
            return False  # a concurrent run of the task recorded (and keeps) this turn's
    if outcome.message is None:
        return False
    return summary_draft_store(session.pk, claim, base, outcome.message)


def turn_memory_keep(*, session_id: str, turn: int) -> int:
    """Keep what a finished turn said worth keeping; the number of changes made.

    1. "remember that ..." in the user's messages, stored as they said it (the rules
       decide what it replaces).
    2. With extraction on: one call to the cheap model, shown the owner's nearest
       memories (those of step 1 included) and the turn, answers add / update / delete /
       keep entries (engine/gates/memory.py `extraction_decide`), each applied under the
       owner's lock. The offline rules model, a call that fails or an invalid answer:
       the deterministic extractor, decided by the rules.
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
            for key, candidate in explicit_keeps(messages):
                done = _keep(session, candidate, key, VersionActor.USER, confidence=0.9)
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

    1. Decide (the gate): the cheap model (one call), else the rules.
    2. Embed every text to be written, outside any transaction: the vectors land in the
       embedding cache, so the writes below make no HTTP call under a lock.
    3. In one transaction: the call's record (row, rollups, charge) and every write it
       decided. A task that dies before this commits leaves neither, and its retry calls
       again; one that dies after finds the record and does nothing. The turn is kept
       exactly once.
    """
    user_texts = [m.content for m in messages if m.role == "user"]
    decided = extraction_decide(session, turn, agent, messages, user_texts)
    if decided.done:
        return 0
    writes, deletes = extraction_changes(decided, session.pk, turn, user_texts)
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
