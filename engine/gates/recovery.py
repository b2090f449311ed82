"""Recovery in the tool step: calls that were dispatched before a crash (their send may or
may not have happened) are probed; a call the probe finds done is settled with its result.

A probe that cannot tell (it failed, timed out, answered 5xx or `{"status": "unknown"}`)
is asked again later: the step is deferred (`StepDeferred`: the session's lease lapses
then, in the database, and no worker waits), `RECOVERY_PROBE_BACKOFF_S`, then twice that,
... up to `RECOVERY_PROBE_ATTEMPTS` probes in all. Still unknown after that, a call that is
not safe to send again goes to a person (the `recovery_reviews_open` move: took effect /
not taken / send again); an idempotent one is sent again with the same idempotency key,
after its business precheck (engine/gates/revalidation.py `pending_prechecks`).
"""

import asyncio
from dataclasses import dataclass, field

from django.conf import settings

from engine.gates import Verdict, Wait
from record.models import ToolCall, ToolCallStatus
from runtime import io_loop
from tools.execution import NO_PROBE, ProbeResult, ToolOutcome, ToolSnapshot, probe
from tools.rendering import render_success


@dataclass
class Recovered:
    """A probe verdict's intent (its settled calls: those a probe found done, with what it
    read back, not sent again; its wait: a probe could not tell and may be asked again,
    the step waits its backoff first)."""

    # Calls no probe could settle and not safe to send again, with why a person must decide.
    to_review: list[tuple[ToolCall, str]] = field(default_factory=list)
    # Every call probed, and whether its probe could not tell (its count goes up): the
    # tool phase records them (engine/moves/checkpoint.py `calls_probed`).
    probed: list[tuple[ToolCall, bool]] = field(default_factory=list)


def review_reason(call: ToolCall, said: str) -> str:
    return (
        f"Did this call take effect? {call.tool_name} was sent with idempotency key "
        f"{call.idempotency_key} before a crash; it cannot safely be sent again and "
        f"the probe said: {said}."
    )


def probe_backoff_s(probes: int) -> float:
    """The wait before probe number `probes + 1` (`probes` >= 1 could not tell)."""
    return float(settings.RECOVERY_PROBE_BACKOFF_S * 2 ** max(probes - 1, 0))


def recovery_probe(calls: list[ToolCall], tools: dict[str, ToolSnapshot]) -> Verdict[Recovered]:
    """Probe the side-effecting calls among `calls` that were dispatched; each probe's
    verdict (and the count of those that could not tell) is set on its call and listed in
    `probed` for the tool phase to record (the admin shows it).

    1. Probe them all at once.
    2. Done: settled with the result read back. Not done: sent again (same key).
    3. Unknown, from a probe that may answer later, with probes left: the step waits
       (its wait: the shortest call's backoff) and probes again.
    4. Unknown for good (or no probe at all): a person decides when the tool is not
       idempotent; an idempotent call is sent again with its key.
    """
    uncertain = [
        c
        for c in calls
        if c.dispatched_at is not None and c.tool_name in tools and tools[c.tool_name].side_effects
    ]
    recovered = Recovered()
    settled: dict[int, ToolOutcome] = {}
    retry_after_s: float | None = None
    if not uncertain:
        return Verdict(intent=recovered)
    probes = io_loop.run(_probe_all(uncertain, tools))
    for call, result in zip(uncertain, probes, strict=True):
        call.probe_outcome = result.verdict
        unsure = result.verdict == "unknown" and result.detail != NO_PROBE
        if unsure:
            call.probes += 1
        recovered.probed.append((call, unsure))
        if result.verdict == "done":
            output = result.output or {}
            settled[call.pk] = ToolOutcome(
                status=ToolCallStatus.SUCCESS,
                output=output,
                content=render_success(output),
                extra={"probed": True},
            )
        elif unsure and call.probes < settings.RECOVERY_PROBE_ATTEMPTS:
            backoff = probe_backoff_s(call.probes)
            retry_after_s = min(retry_after_s or backoff, backoff)
        elif result.verdict == "unknown" and not tools[call.tool_name].idempotent:
            # Not safe to send again, and no probe could tell: a person decides.
            said = result.detail or NO_PROBE
            if unsure:
                said = f"it could not tell after {call.probes} probes ({said})"
            recovered.to_review.append((call, review_reason(call, said)))
    # A probe to ask again comes first: the reviews wait for its answer.
    again = Wait("probe", retry_after_s) if retry_after_s is not None else None
    return Verdict(settled=settled, wait=again, intent=recovered)


async def _probe_all(calls: list[ToolCall], tools: dict[str, ToolSnapshot]) -> list[ProbeResult]:
    return list(
        await asyncio.gather(*(probe(tools[c.tool_name], c.idempotency_key) for c in calls))
    )
