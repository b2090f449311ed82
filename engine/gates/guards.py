"""The turn's tool calls judged: loop guards stop a turn whose calls have stopped making
progress; after tool results, a note tells the model which calls did not run or did not
succeed (`calls_note`).

The guards are pure functions of the turn's tool calls (read from the database), so a
step re-run after a crash reaches the same verdict.
"""

import difflib
import hashlib
import json
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from engine.gates import Verdict
from memory.tokens import count_message_tokens
from record.events import StopReason, call_kind
from record.models import Message, MessageRole, Session

NEAR_SAME_RATIO = 0.9


@dataclass(frozen=True)
class CallRecord:
    tool: str
    arguments: Any
    output: Any
    status: str
    refusal: str = ""  # why a call did not run (ToolCall.refusal), for the turn's outcome

    # Made once per call, not at every judgement: the run keeps a turn's records
    # (runtime_cache.TurnCalls) and judges them again at each model step.
    @cached_property
    def arguments_text(self) -> str:
        return canonical_json(self.arguments)

    @cached_property
    def output_digest(self) -> str:
        return _digest(self.output)


@dataclass(frozen=True)
class GuardVerdict:
    """A loop guard's intent: the step is the turn's last, the model asked for an answer
    without tools and told why (also the iteration and time limits', engine/phases/model.py
    `loop_stop`)."""

    stop_reason: StopReason
    note: str  # told to the model when it is asked for a final answer


@dataclass(frozen=True)
class GuardLimits:
    repeat_limit: int = 3
    same_result_limit: int = 2
    cycle_repeats: int = 2
    max_cycle: int = 4


def canonical_json(value: Any) -> str:
    """One text per value: keys sorted, no spaces. Arguments compare, hash and cache by it."""
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"), default=str)


def _digest(value: Any) -> str:
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()


def nearly_same(a: Any, b: Any) -> bool:
    """Field by field: the same keys, and each value equal or a string worded nearly alike.

    Comparing the whole JSON text instead made `{"number": "SO-1001"}` and
    `{"number": "SO-1002"}` (or customer 17 and 18) "nearly the same": looking
    up three orders one after another would have been stopped as a loop.
    """
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(nearly_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(nearly_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, str) and isinstance(b, str):
        return a == b or difflib.SequenceMatcher(None, a, b).ratio() >= NEAR_SAME_RATIO
    return canonical_json(a) == canonical_json(b)


def _signature(step: Sequence[CallRecord]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((c.tool, c.arguments_text) for c in step))


def _steps_nearly_same(a: Sequence[CallRecord], b: Sequence[CallRecord]) -> bool:
    left, right = sorted(a, key=lambda c: c.tool), sorted(b, key=lambda c: c.tool)
    return [c.tool for c in left] == [c.tool for c in right] and all(
        nearly_same(x.arguments, y.arguments) for x, y in zip(left, right, strict=True)
    )


def check(
    steps: Sequence[Sequence[CallRecord]], limits: GuardLimits = GuardLimits()
) -> Verdict[GuardVerdict]:
    """Judge the turn's tool steps so far (each the calls of one model response), oldest
    first; the verdict's intent, if any: the step is made final (no tools, this note).

    Steps, not single calls, are compared: notifying five customers in one
    response is a fan-out, not a loop.
    """
    return Verdict(intent=_loop(steps, limits))


def _loop(steps: Sequence[Sequence[CallRecord]], limits: GuardLimits) -> GuardVerdict | None:
    steps = [s for s in steps if s]
    n = limits.repeat_limit
    if len(steps) >= n:
        tail = steps[-n:]
        if all(_steps_nearly_same(tail[0], s) for s in tail[1:]):
            tools = ", ".join(sorted({c.tool for c in tail[0]}))
            return GuardVerdict(
                StopReason.REPEATED_CALL,
                f"You called {tools} {n} times in a row with (nearly) the same arguments. "
                "That is not making progress: do not call it again.",
            )
    k = limits.same_result_limit
    if len(steps) >= k + 1:
        tail = steps[-(k + 1) :]
        results = {tuple(sorted((c.tool, c.output_digest) for c in s)) for s in tail}
        if len(results) == 1 and all(c.status == "success" for c in tail[0]):
            tools = ", ".join(sorted({c.tool for c in tail[0]}))
            return GuardVerdict(
                StopReason.NO_NEW_INFORMATION,
                f"The last {k + 1} results of {tools} were identical, so further calls bring no new information.",
            )
    keys = [_signature(s) for s in steps]
    for period in range(2, limits.max_cycle + 1):
        span = period * limits.cycle_repeats
        if len(keys) < span:
            break
        window = keys[-span:]
        block = window[:period]
        if len(set(block)) > 1 and all(window[i] == block[i % period] for i in range(span)):
            names = " -> ".join("+".join(tool for tool, _ in sig) for sig in block)
            return GuardVerdict(
                StopReason.CYCLE,
                f"Your tool calls are going round in a cycle ({names}), repeating without progress.",
            )
    return None


# --- After tool results: the note on calls that did not run or did not succeed ---
# After tool results: one plain note on the calls that did not run or did not succeed.
#
# A failed call's result already says so, but a model reading several results (three
# notifications refused, a report written) easily answers as if all had happened. The
# model step right after such results gets a platform note (a system message, committed
# with the step like the environment note) that says, per tool, how many of the calls did
# NOT run and why, or failed, and that only what succeeded took effect.

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
) -> Verdict[None]:
    """Right after tool results where calls did not run or failed, the note saying so.

    `turn_calls`: the turn's calls per model step (the run keeps them); the history's
    latest results are the last step's, read only when the history ends with results."""
    if not _latest_results(history):
        return Verdict()
    steps = turn_calls()
    text = note_text(steps[-1]) if steps else None
    if text is None:
        return Verdict()
    return Verdict.note(
        Message(
            turn=session.turn,
            role=MessageRole.SYSTEM,
            name=NOTE_NAME,
            content=text,
            token_count=count_message_tokens(text),
        )
    )
