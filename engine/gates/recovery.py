"""Recovery in the tool step: calls that were dispatched before a crash (their send may or
may not have happened) are probed once; a call the probe finds done is settled with its
result, and one no probe could settle that is not safe to send again goes to a person (the
`recovery_reviews_open` move). The rest are sent again with the same idempotency key.
"""

import asyncio
from dataclasses import dataclass, field

from runtime import io_loop
from sessions.models import ToolCall, ToolCallStatus
from tools.execution import ProbeResult, ToolOutcome, ToolSnapshot, probe
from tools.rendering import render_success


@dataclass
class Recovered:
    # Calls a probe found done: settled with what it read back, not sent again.
    outcomes: dict[int, ToolOutcome] = field(default_factory=dict)
    # Calls no probe could settle and not safe to send again, with what the probe said.
    to_review: list[tuple[ToolCall, str]] = field(default_factory=list)


def recovery_probe(calls: list[ToolCall], tools: dict[str, ToolSnapshot]) -> Recovered:
    """Probe the side-effecting calls among `calls` that were dispatched; each probe's
    verdict is kept on its call (the admin shows it)."""
    uncertain = [
        c
        for c in calls
        if c.dispatched_at is not None and c.tool_name in tools and tools[c.tool_name].side_effects
    ]
    recovered = Recovered()
    if not uncertain:
        return recovered
    probes = io_loop.run(_probe_all(uncertain, tools))
    for call, result in zip(uncertain, probes, strict=True):
        call.probe_outcome = result.verdict
        ToolCall.objects.filter(pk=call.pk).update(probe_outcome=result.verdict)
        if result.verdict == "done":
            output = result.output or {}
            recovered.outcomes[call.pk] = ToolOutcome(
                status=ToolCallStatus.SUCCESS,
                output=output,
                content=render_success(output),
                extra={"probed": True},
            )
        elif result.verdict == "unknown" and not tools[call.tool_name].idempotent:
            # Not safe to send again, and no probe could tell: a person decides.
            recovered.to_review.append((call, result.detail or "the tool has no probe"))
    return recovered


async def _probe_all(calls: list[ToolCall], tools: dict[str, ToolSnapshot]) -> list[ProbeResult]:
    return list(
        await asyncio.gather(*(probe(tools[c.tool_name], c.idempotency_key) for c in calls))
    )
