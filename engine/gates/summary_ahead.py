"""Summaries made ahead of need, off the step's critical path (README "Context budget and
summaries").

A step whose history passed `summarise_ahead_at` (60% of the history partition, after
trimming) enqueues `sessions.tasks.summarise_ahead` once it has committed. The task
makes the summary the step at `summarise_at` (90%) would otherwise make inline, and
keeps it as the session's `SummaryDraft`; that step uses it without a model call
(engine/model/summaries.py `summary_draft_use`).
"""

import logging
from datetime import datetime

from engine.gates.metering import model_credits_check, side_call_charges
from engine.model.calls import request_tokenizer, request_window
from engine.model.context import assemble
from engine.model.summaries import (
    SUMMARY_OUTPUT_TOKENS,
    summarise,
    summary_base,
    summary_draft_claim,
    summary_draft_release,
    summary_draft_store,
    summary_endpoint,
)
from engine.store.side_calls import side_call_commit
from llm.types import ChatMessage, ChatRequest
from record.models import Message, MessageStatus, ModelCall, Session
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
