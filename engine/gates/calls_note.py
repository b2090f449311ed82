"""After tool results: one plain note on the calls that did not run or did not succeed.

A failed call's result already says so, but a model reading several results (three
notifications refused, a report written) easily answers as if all had happened. The
model step right after such results gets a platform note (a system message, committed
with the step like the environment note) that says, per tool, how many of the calls did
NOT run and why, or failed, and that only what succeeded took effect.
"""

from collections import Counter
from collections.abc import Callable, Sequence

from engine.gates import Contribution
from engine.gates.guards import CallRecord
from memory.tokens import count_message_tokens
from record.events import call_kind
from record.models import Message, MessageRole, Session

NOTE_NAME = "calls_not_done"

# Why a call did not run, per `CallCounts` key, as the note says it.
NOT_RUN = {
    "rejected": "rejected by an approver",
    "expired": "no approver decided before the deadline",
    "unpaid": "not enough credit points",
}


def _latest_results(history: Sequence[Message]) -> int:
    """How many tool results end the history (platform notes between them aside); 0 when
    the model has spoken since, or when this note was already given for them."""
    count = 0
    for message in reversed(history):
        if message.role == MessageRole.TOOL:
            count += 1
        elif message.role == MessageRole.SYSTEM:
            if message.name == NOTE_NAME:
                return 0
        else:
            break
    return count


def _reasons(kinds: Counter[str]) -> str:
    if len(kinds) == 1:
        return next(iter(kinds))
    return ", ".join(f"{n} {reason}" for reason, n in kinds.most_common())


def note_text(calls: Sequence[CallRecord]) -> str | None:
    """The note on a step's calls; None when every call succeeded."""
    per_tool: dict[str, list[CallRecord]] = {}
    for call in calls:
        per_tool.setdefault(call.tool, []).append(call)
    sentences: list[str] = []
    for tool, records in per_tool.items():
        total = len(records)
        not_run: Counter[str] = Counter()
        failed: Counter[str] = Counter()
        for record in records:
            kind = call_kind(record.status, record.refusal)
            if kind in NOT_RUN:
                not_run[NOT_RUN[kind]] += 1
            elif record.status == "timeout":
                failed["timed out: whether it took effect is unknown"] += 1
            elif kind == "failed":
                failed["it returned an error"] += 1
        noun = f"{tool} call{'s' if total != 1 else ''}"
        if not_run:
            n = sum(not_run.values())
            sentences.append(f"{n} of {total} {noun} did NOT run ({_reasons(not_run)})")
        if failed:
            n = sum(failed.values())
            sentences.append(f"{n} of {total} {noun} did NOT succeed ({_reasons(failed)})")
    if not sentences:
        return None
    return (
        "Note from the platform on the tool calls just made: "
        + "; ".join(sentences)
        + ". Only the calls that succeeded took effect: try again where that makes sense, but "
        "do not say or imply that the others happened; tell the user plainly what was not done."
    )


def calls_note(
    session: Session,
    history: Sequence[Message],
    turn_calls: Callable[[], Sequence[Sequence[CallRecord]]],
) -> Contribution:
    """Right after tool results where calls did not run or failed, the note saying so.

    `turn_calls`: the turn's calls per model step (the run keeps them); the history's
    latest results are the last step's, read only when the history ends with results."""
    if not _latest_results(history):
        return Contribution()
    steps = turn_calls()
    text = note_text(steps[-1]) if steps else None
    if text is None:
        return Contribution()
    return Contribution.note(
        Message(
            turn=session.turn,
            role=MessageRole.SYSTEM,
            name=NOTE_NAME,
            content=text,
            token_count=count_message_tokens(text),
        )
    )
