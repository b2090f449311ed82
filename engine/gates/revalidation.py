"""Business-rule revalidation (runtime-mechanisms 4.2): when a run continues after it
was interrupted, the declared prechecks run again before it acts on a stale picture.

- In a model step (`revalidation`), after a resume, a fork or a crash recovery
  (`session.resume_check`), or a pause longer than `ENV_CHECK_PAUSE_S` since the model's
  latest message: on the arguments of each tool's last call; the model is told
  what no longer holds ("the order was paid meanwhile"), in a system note written with
  the step's commit and seen by every later model call of the run.
- In a tool step (`pending_prechecks`), on the calls about to be sent: after a crash
  recovery, after a pause longer than `ENV_CHECK_PAUSE_S` since the model decided them,
  and before an uncertain call (its probe could not tell, or said not done) is sent
  again. A side-effecting call whose check fails (or cannot answer) is not sent: it goes
  to a person in the approvals queue (a recovery review, with what failed); a read-only
  one is not run and the model reads why.
"""

import json
from dataclasses import dataclass, field
from typing import Any

from django.db import connection
from django.utils import timezone

from approvals.models import ReviewAnswer
from approvals.selectors import reviews_for_calls
from approvals.states import ApprovalStatus
from engine.gates import Verdict, Wait
from engine.model.environment import model_paused, past_pause
from memory.tokens import count_message_tokens
from record.models import Message, Session, ToolCall, ToolCallStatus
from runtime import io_loop
from tools.execution import ToolOutcome, ToolSnapshot
from tools.prechecks import PrecheckResult, has_precheck, prechecks_run
from tools.rendering import render_failure, render_success

ARGS_MAX_CHARS = 200


def last_calls(
    history: list[Message], tools: dict[str, ToolSnapshot]
) -> list[tuple[ToolSnapshot, dict[str, Any]]]:
    """The latest call of each tool that declares a precheck, newest first."""
    found: dict[str, dict[str, Any]] = {}
    for message in reversed(history):
        for call in reversed(message.tool_calls or []):
            name = call.get("name")
            tool = tools.get(name) if isinstance(name, str) else None
            if tool is None or name in found or not has_precheck(tool):
                continue
            arguments = call.get("arguments")
            found[name] = arguments if isinstance(arguments, dict) else {}
    return [(tools[name], arguments) for name, arguments in found.items()]


def _call_text(result: PrecheckResult) -> str:
    args = json.dumps(result.arguments, sort_keys=True, ensure_ascii=False)
    if len(args) > ARGS_MAX_CHARS:
        args = args[: ARGS_MAX_CHARS - 1] + "…"
    return f"{result.tool}({args})"


def note_text(results: list[PrecheckResult]) -> str | None:
    """What the model is told; None when every check still holds."""
    changed = [r for r in results if r.holds is False]
    unsure = [r for r in results if r.holds is None]
    if not changed and not unsure:
        return None
    parts = [f"{_call_text(r)}: {r.reason}" for r in changed]
    parts += [f"{_call_text(r)}: could not be confirmed ({r.reason})" for r in unsure]
    return (
        "Note from the platform: before this conversation continues, the preconditions "
        "of earlier actions were checked again. "
        + "; ".join(parts)
        + ". Do not repeat an action whose precondition no longer holds or could not be "
        "confirmed; work from the current state and tell the user what changed."
    )


def revalidation(
    session: Session, history: list[Message], tools: dict[str, ToolSnapshot]
) -> Verdict[None]:
    """After a resume, a fork or a crash recovery (`session.resume_check`), or when the
    model last spoke longer than `ENV_CHECK_PAUSE_S` ago, run the prechecks; a note if
    any precondition changed. No database connection is held across the checks."""
    if not (session.resume_check or model_paused(history)):
        return Verdict()
    calls = last_calls(history, tools)
    if not calls:
        return Verdict()
    connection.close()
    text = note_text(io_loop.run(prechecks_run(calls)))
    if text is None:
        return Verdict()
    return Verdict.note(
        Message(
            turn=session.turn, role="system", content=text, token_count=count_message_tokens(text)
        )
    )


# What a person is asked about a call never sent whose check failed (the model, if they
# say not_taken, reads the reason without it).
SEND_ANYWAY = " Send this call anyway (send_again), or not (not_taken: the model is told)?"


@dataclass
class Rechecked:
    """A precheck verdict's intent (its settled calls: read-only calls whose precondition
    no longer holds, not run; the model reads why)."""

    # Side-effecting calls whose check failed or could not answer, with what a person reads.
    to_review: list[tuple[ToolCall, str]] = field(default_factory=list)
    # Some check ran: this recovery's revalidation is done (the results' commit clears
    # `resume_check`, so the next model step does not check the calls just sent again).
    checked: bool = False


def _why(session: Session, call: ToolCall) -> str:
    if call.dispatched_at is not None:
        return f"before sending it again (its probe said: {call.probe_outcome or 'nothing'})"
    if session.resume_check:
        return "after the run was interrupted and recovered"
    minutes = (timezone.now() - call.created_at).total_seconds() / 60 if call.created_at else 0
    return f"after a pause of {minutes:.0f} min since it was decided"


def _wants_check(session: Session, call: ToolCall) -> bool:
    return call.dispatched_at is not None or session.resume_check or past_pause(call.created_at)


def pending_prechecks(
    session: Session, calls: list[ToolCall], tools: dict[str, ToolSnapshot]
) -> Verdict[Rechecked]:
    """Check again the preconditions of the calls about to be sent, when they may be stale.

    1. The calls whose tool declares a precheck and that were decided before a crash
       recovery or a long pause, or are uncertain and about to be sent again.
    2. Run the checks at once, holding no database connection.
    3. A check that does not hold or cannot answer: a side-effecting call goes to a
       person (a recovery review saying what failed); a read-only call whose check
       does not hold is not run and the model reads why (one that cannot answer runs).
    """
    wanted = [
        c
        for c in calls
        if (tool := tools.get(c.tool_name)) is not None
        and has_precheck(tool)
        and isinstance(c.input, dict)
        and not c.error
        and _wants_check(session, c)
    ]
    rechecked = Rechecked()
    settled: dict[int, ToolOutcome] = {}
    if not wanted:
        return Verdict(intent=rechecked)
    connection.close()
    results = io_loop.run(prechecks_run([(tools[c.tool_name], dict(c.input)) for c in wanted]))
    rechecked.checked = True
    for call, result in zip(wanted, results, strict=True):
        if result.holds:
            continue
        verdict = "could not be confirmed" if result.holds is None else "no longer holds"
        what = f"its precondition was checked again {_why(session, call)} and {verdict}: {result.reason}"
        if tools[call.tool_name].side_effects:
            if call.dispatched_at is not None:
                reason = (
                    f"Did this call take effect? {call.tool_name} was sent with idempotency "
                    f"key {call.idempotency_key} before a crash; {what}. Answer took_effect, "
                    "not_taken (the model is told) or send_again."
                )
            else:
                reason = f"{what[0].upper()}{what[1:]}.{SEND_ANYWAY}"
            rechecked.to_review.append((call, reason))
        elif result.holds is False:
            message = f"this call was not run: {what}. Work from the current state."
            settled[call.pk] = ToolOutcome(
                status=ToolCallStatus.REJECTED,
                output=None,
                error=message,
                content=render_failure(ToolCallStatus.REJECTED, message),
                extra={"precheck": True},
            )
    wait = Wait("review") if rechecked.to_review else None
    return Verdict(settled=settled, wait=wait, intent=rechecked)


# --- Recovery reviews: an uncertain call no probe could settle goes to a person ---


def review_outcomes(calls: list[ToolCall]) -> Verdict[set[int]]:
    """What the people asked about this step's calls answered: uncertain calls (dispatched
    before a crash), and calls never sent whose business precheck failed (those a person
    was asked about: `has_approval`). Settled: the calls a person settled (took effect /
    did not / nobody could tell), not sent; the intent: those a person said to send again
    with the same key, without another probe; a review still open: the step waits."""
    settled: dict[int, ToolOutcome] = {}
    resend: set[int] = set()
    pending = False
    asked = [c for c in calls if c.dispatched_at is not None or getattr(c, "has_approval", True)]
    for call_id, review in reviews_for_calls(call_ids=[c.pk for c in asked]).items():
        call = next(c for c in asked if c.pk == call_id)
        if review.status == ApprovalStatus.PENDING:
            pending = True
        elif review.answer == ReviewAnswer.SEND_AGAIN:
            # Sent again after the answer and uncertain once more: probe (and ask) anew.
            if call.dispatched_at is None or (
                review.decided_at is not None and call.dispatched_at <= review.decided_at
            ):
                resend.add(call_id)
        elif review.answer == ReviewAnswer.TOOK_EFFECT:
            output = review.answer_result if review.answer_result is not None else {}
            settled[call_id] = ToolOutcome(
                status=ToolCallStatus.SUCCESS,
                output=output,
                content=render_success(output),
                extra={"reviewed": str(review.pk)},
            )
        else:
            by = review.decided_by_name or "an operator"
            if review.answer == ReviewAnswer.NOT_TAKEN and call.dispatched_at is None:
                why = review.reason.removesuffix(SEND_ANYWAY)
                message = f"{by} decided not to send this call. {why}"
            elif call.dispatched_at is None:
                why = review.reason.removesuffix(SEND_ANYWAY)
                message = (
                    f"no one decided whether to send this call (review {review.status}); "
                    f"it was not sent. {why}"
                )
            elif review.answer == ReviewAnswer.NOT_TAKEN:
                message = f"{by} checked: this call did not take effect, and it was not sent again."
            else:
                message = (
                    "no one could tell whether this call took effect before a crash "
                    f"(review {review.status}); it was not sent again."
                )
            if review.comment:
                message += f' Comment: "{review.comment}"'
            settled[call_id] = ToolOutcome(
                status=ToolCallStatus.FAILED,
                output=None,
                error=message,
                content=render_failure(ToolCallStatus.FAILED, message),
                extra={"reviewed": str(review.pk)},
            )
    return Verdict(settled=settled, wait=Wait("review") if pending else None, intent=resend)
