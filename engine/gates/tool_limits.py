"""Before tools run: the session's degradation level and each tool's per-owner rate limit.

A call held back here never runs; the model gets a result that says why, as data it can
act on (Core invariant 6):
- level 2: a tool with side effects that is not `critical` is deferred (read-only calls
  were already answered from the cache where one matched);
- level 3: only `critical` tools run;
- over the tool's calls or tokens per minute for this owner: `rate_limited`, with the wait.
"""

import json
import math

from billing.degradation import CACHED, CRITICAL_ONLY
from billing.ratelimit import RateLimit, rate_limit_take
from engine.gates import Verdict
from memory.tokens import count_tokens
from record.models import Session, ToolCall, ToolCallStatus
from tools.execution import ToolOutcome, ToolSnapshot
from tools.rendering import render_failure


def retry_after_whole_s(wait_s: float) -> int:
    """A limiter's wait as the whole seconds a caller is told: rounded up, at least 1."""
    return max(math.ceil(wait_s), 1)


def _held(code: str, message: str, **details: object) -> ToolOutcome:
    return ToolOutcome(
        status=ToolCallStatus.FAILED,
        output={"error": {"code": code, "message": message, **details}},
        error=message,
        content=render_failure(code, message),
    )


def _deferred(session: Session, tool: ToolSnapshot) -> ToolOutcome | None:
    level = session.degradation_level
    if tool.critical or level < CACHED:
        return None
    if level >= CRITICAL_ONLY or tool.side_effects:
        return _held(
            "degraded",
            f"{tool.name} is deferred: the platform is running at degradation level {level} "
            "and only runs essential tools now. Answer with what you have, or try later.",
            level=level,
        )
    return None


def tool_gates(
    session: Session, calls: list[ToolCall], tools: dict[str, ToolSnapshot]
) -> Verdict[None]:
    """The calls that must not run now, settled with why (the others are left out)."""
    held: dict[int, ToolOutcome] = {}
    for call in calls:
        tool = tools.get(call.tool_name)
        if tool is None or call.dispatched_at is not None:
            # The executor answers an unknown tool; a call sent before a crash is finished
            # as it started (it may have taken effect already).
            continue
        deferred = _deferred(session, tool)
        if deferred is not None:
            held[call.pk] = deferred
            continue
        limit = RateLimit(tool.rate_limit_calls_per_min, tool.rate_limit_tokens_per_min)
        if not limit.active:
            continue
        tokens = count_tokens(json.dumps(call.input, default=str)) if limit.tokens_per_min else 0
        wait = rate_limit_take(
            kind="tool", name=tool.name, owner_id=session.owner_id, limit=limit, tokens=tokens
        )
        if wait is not None:
            # Whole seconds, rounded up (as HTTP's Retry-After): rounded to the nearest, a
            # call refused in a window's last moments told the model "again in 0 s" while
            # the tool was still limited.
            after_s = retry_after_whole_s(wait)
            held[call.pk] = _held(
                "rate_limited",
                f"{tool.name} is rate limited for this user; it can be called again in "
                f"{after_s} s. Do something else meanwhile or tell the user.",
                retry_after_s=after_s,
            )
    return Verdict(settled=held)
