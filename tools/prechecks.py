"""Business-rule prechecks (runtime-mechanisms 4.2): when a run continues on a picture that
may be stale (a resume, a fork, a crash recovery, a long pause, an uncertain call about to
be sent again), each tool that declares one checks again the preconditions a call's
arguments depend on ("the order still exists and is unpaid"); engine/gates/revalidation.py
decides when and what follows.

A tool declares its check in the config file (or the admin):

- `precheck_url` (HTTP): POSTed `{"tool": name, "arguments": {...}}` with the tool's
  headers; answers 200 with `{"ok": true}` or `{"ok": false, "reason": "..."}`.
- `precheck_handler` (Python): a registered handler (tools/registry.py) called with the
  call's arguments; returns None or True when the preconditions hold, False or a string
  (what changed) when they do not.

A check that cannot answer (unreachable, a timeout, an unexpected reply) is reported as
such: the model is told the precondition could not be confirmed, never that it holds.
"""

import asyncio
import inspect
from dataclasses import dataclass
from typing import Any

from django.db import connection

from observability.redaction import scrub

from .execution import ToolSnapshot, _client, http_headers
from .registry import get_handler

REASON_MAX_CHARS = 300


@dataclass(frozen=True)
class PrecheckResult:
    tool: str
    arguments: dict[str, Any]
    holds: bool | None  # None: the check could not tell
    reason: str = ""


def has_precheck(tool: ToolSnapshot) -> bool:
    return bool(tool.precheck_url or tool.precheck_handler)


def _verdict(value: Any) -> tuple[bool, str]:
    """A Python check's answer: None/True hold; False or a string (what changed) do not."""
    if value is None or value is True:
        return True, ""
    if value is False:
        return False, "the precondition no longer holds"
    if isinstance(value, dict):
        return bool(value.get("ok")), str(value.get("reason") or "")
    return False, str(value)


def _python_sync(name: str, arguments: dict[str, Any]) -> Any:
    try:
        return get_handler(name).func(**arguments)
    finally:
        connection.close()  # a helper thread: give its connection back


async def precheck(tool: ToolSnapshot, arguments: dict[str, Any]) -> PrecheckResult:
    """Run the tool's declared check on `arguments` (the caller knows it declares one)."""
    try:
        if tool.precheck_handler:
            handler = get_handler(tool.precheck_handler)
            if inspect.iscoroutinefunction(handler.func):
                value = await asyncio.wait_for(handler.func(**arguments), timeout=tool.timeout_s)
            else:
                value = await asyncio.wait_for(
                    asyncio.to_thread(_python_sync, tool.precheck_handler, arguments),
                    timeout=tool.timeout_s,
                )
            holds, reason = _verdict(value)
        else:
            response = await asyncio.wait_for(
                _client().post(
                    tool.precheck_url,
                    json={"tool": tool.name, "arguments": arguments},
                    headers=http_headers(tool, ""),
                ),
                timeout=tool.timeout_s,
            )
            body = response.json() if response.status_code == 200 else None
            if not isinstance(body, dict) or not isinstance(body.get("ok"), bool):
                return PrecheckResult(
                    tool.name,
                    arguments,
                    None,
                    f"the check answered HTTP {response.status_code} without a verdict",
                )
            holds, reason = body["ok"], str(body.get("reason") or "")
    except Exception as exc:  # noqa: BLE001 - a check that fails cannot tell
        return PrecheckResult(
            tool.name, arguments, None, f"the check failed ({type(exc).__name__})"
        )
    if not holds and not reason:
        reason = "the precondition no longer holds"
    # The reason is the business API's (or handler's) own words: scrubbed like a tool's error
    # before it becomes the model's note.
    return PrecheckResult(tool.name, arguments, holds, scrub(reason)[:REASON_MAX_CHARS])


async def prechecks_run(
    calls: list[tuple[ToolSnapshot, dict[str, Any]]],
) -> list[PrecheckResult]:
    """All the checks at once (each bounded by its tool's timeout)."""
    return list(await asyncio.gather(*(precheck(tool, args) for tool, args in calls)))
