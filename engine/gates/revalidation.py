"""Business-rule revalidation (runtime-mechanisms 4.2): before a resumed or forked run
continues, the declared prechecks of the tools it used run on the arguments of each
tool's last call, and the model is told what no longer holds, so it does not repeat an
action whose premise changed ("the order was paid meanwhile") on a stale picture.

The note is a system message like the environment note (environment.py): written with
the model step's commit, seen by this and every later model call of the run.
"""

import json
from typing import Any

from django.db import connection

from engine.gates import Contribution
from memory.tokens import count_message_tokens
from runtime import io_loop
from sessions.models import Message, Session
from tools.execution import ToolSnapshot
from tools.prechecks import PrecheckResult, has_precheck, prechecks_run

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
) -> Contribution:
    """After a resume or a fork (`session.resume_check`), run the prechecks; a note if
    any precondition changed. No database connection is held across the checks."""
    if not session.resume_check:
        return Contribution()
    calls = last_calls(history, tools)
    if not calls:
        return Contribution()
    connection.close()
    text = note_text(io_loop.run(prechecks_run(calls)))
    if text is None:
        return Contribution()
    return Contribution.note(
        Message(
            turn=session.turn, role="system", content=text, token_count=count_message_tokens(text)
        )
    )
