"""An evaluation's replay: a recorded turn run again on a candidate answers its tool calls
from the record, and never sends a side effect.

A replay session (`Session.evaluation_id` set; `metadata["replay"]` names the recorded
session, turn and whether read-only calls the record lacks may run) asks this gate before
any other in its tool step (engine/phases/tools.py `replay_step`):

- a call with the same tool and the same arguments (compared as canonical JSON) as a
  recorded call of that turn gets the recorded outcome and the very tool message the model
  saw then: a result, a failure, an approver's rejection or the user's answer to
  `ask_user` alike (the n-th identical call gets the n-th recorded one, then the last);
- `ask_user` is matched by name only: the question's wording may differ, the answer is
  the user's; so is a workflow's human node (its review tool is named after the node):
  the card's summary may differ, the decision is the approver's;
- a call the record lacks is never sent when it has side effects (or is not the
  executor's: another agent, a handoff, a question, memory): it is settled as `rejected`
  with the refusal `not_sent`, its arguments kept: a "would have called";
- a read-only call the record lacks runs for real only when the evaluation allows it
  (it is left unsettled, for the caller to run), else it is refused the same way;
- a workflow's wait (a wait node, a retry's pause) is over at once: a replay never waits.
"""

import json
from dataclasses import dataclass
from typing import Any

from django.db import connection

from engine.gates import Verdict
from record.models import Message, Refusal, Session, ToolCall, ToolCallStatus
from record.rows import json_value
from tools.builtin import ASK_USER_HANDLER, WORKFLOW_REVIEW_HANDLER
from tools.execution import ToolOutcome, ToolSnapshot
from tools.rendering import render_failure, render_success
from workflows.node_tools import WAIT_TOOL

NOT_SENT_NOTE = (
    "Not sent: this is an evaluation's replay of a recorded conversation, and the record "
    "has no such call. Answer as well as you can without its result."
)
# The kinds the executor runs itself (tools/execution.py `_invoke`); any other is never run
# for real in a replay.
_EXECUTED = frozenset({"python", "http", "mcp"})
_NOT_WAITED = {"waited": False, "note": "an evaluation's replay does not wait"}
# A person answers these: matched by the tool's name alone (module doc).
_BY_NAME = frozenset({ASK_USER_HANDLER, WORKFLOW_REVIEW_HANDLER})


@dataclass(frozen=True)
class ReplaySource:
    session_id: str
    turn: int
    read_only_calls: bool


def replay_source(session: Session) -> ReplaySource | None:
    """What this session replays, or None (an ordinary session)."""
    if session.evaluation_id is None:
        return None
    spec = (session.metadata or {}).get("replay") or {}
    return ReplaySource(
        session_id=str(spec.get("session", "")),
        turn=int(spec.get("turn", 0)),
        read_only_calls=bool(spec.get("read_only_calls", False)),
    )


def canonical(arguments: Any) -> str:
    """Arguments as one comparable text: key order and spacing do not matter."""
    return json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


# The recorded turn's calls with the tool message the model saw for each, and this replay's
# turn's earlier calls (`mine`): one round trip.
_RECORD_SQL = f"""
SELECT false, c.tool_name, c.input, c.call_id, c.status, c.refusal, c.output, c.error,
       c.elapsed_ms, m.content, c.step, c.position, c.id
  FROM "{ToolCall._meta.db_table}" c
  LEFT JOIN "{Message._meta.db_table}" m
    ON m.session_id = c.session_id AND m.turn = c.turn AND m.role = 'tool'
   AND m.tool_call_id = c.call_id
 WHERE c.session_id = %(source)s AND c.turn = %(turn)s
UNION ALL
SELECT true, tool_name, input, call_id, status, refusal, NULL, '', NULL, NULL, step, position, id
  FROM "{ToolCall._meta.db_table}"
 WHERE session_id = %(replay)s AND turn = %(replay_turn)s AND NOT (id = ANY(%(open)s))
ORDER BY 1, 11, 12, 13
"""  # nosec B608 - table names from the models, values bound


def replay_gate(
    session: Session, source: ReplaySource, calls: list[ToolCall], tools: dict[str, ToolSnapshot]
) -> Verdict[list[ToolCall]]:
    """Settle each of the step's calls from the record; the intent: the calls that may run
    (module doc)."""
    recorded: list[ToolCall] = []
    contents: dict[str, str] = {}
    seen: dict[str, int] = {}
    open_ids = [c.pk for c in calls]
    with connection.cursor() as cursor:
        cursor.execute(
            _RECORD_SQL,
            {
                "source": source.session_id,
                "turn": source.turn,
                "replay": session.pk,
                "replay_turn": session.turn,
                "open": open_ids,
            },
        )
        for (
            mine,
            name,
            arguments,
            call_id,
            status,
            refusal,
            output,
            error,
            elapsed,
            content,
            *_,
        ) in cursor.fetchall():
            arguments = json_value(arguments)
            if mine:
                # An earlier step of this replay's turn: the n-th identical call gets the
                # n-th recorded one.
                key = _match_key(name, arguments, tools)
                seen[key] = seen.get(key, 0) + 1
                continue
            recorded.append(
                ToolCall(
                    tool_name=name, input=arguments, call_id=call_id, status=status,
                    refusal=refusal, output=json_value(output), error=error, elapsed_ms=elapsed,
                )
            )  # fmt: skip
            if content is not None:
                contents[call_id] = content
    settled: dict[int, ToolOutcome] = {}
    to_run: list[ToolCall] = []
    for call in calls:
        if call.tool_name == WAIT_TOOL:
            # A workflow's wait (a wait node, a retry's pause) is over at once, recorded or
            # not: no output, so the results' move sets no timer (a replay never waits).
            settled[call.pk] = ToolOutcome(
                status=ToolCallStatus.SUCCESS, output=None, content=render_success(_NOT_WAITED)
            )
            continue
        key = _match_key(call.tool_name, call.input, tools)
        same = [r for r in recorded if _match_key(r.tool_name, r.input, tools) == key]
        nth = seen.get(key, 0)
        seen[key] = nth + 1
        if same:
            settled[call.pk] = _recorded_outcome(same[min(nth, len(same) - 1)], contents)
            continue
        tool = tools.get(call.tool_name)
        if tool is None:
            # An unknown or forbidden tool: the executor's own refusal, which sends nothing.
            to_run.append(call)
        elif (
            source.read_only_calls
            and not tool.side_effects
            and tool.kind in _EXECUTED
            and tool.handler not in _BY_NAME
        ):
            to_run.append(call)
        else:
            settled[call.pk] = ToolOutcome(
                status=ToolCallStatus.REJECTED,
                output=None,
                error="not sent (evaluation replay)",
                content=render_failure(Refusal.NOT_SENT.value, NOT_SENT_NOTE),
                extra={"refusal": Refusal.NOT_SENT},
            )
    return Verdict(settled=settled, intent=to_run)


def _match_key(name: str, arguments: Any, tools: dict[str, ToolSnapshot]) -> str:
    tool = tools.get(name)
    if tool is not None and tool.handler in _BY_NAME:
        return name  # the person's answer, whatever the question's or the card's wording
    return f"{name}\x00{canonical(arguments)}"


def _recorded_outcome(call: ToolCall, contents: dict[str, str]) -> ToolOutcome:
    output = call.output if isinstance(call.output, dict) else None
    status = call.status if call.status != ToolCallStatus.EXECUTING else ToolCallStatus.FAILED
    content = contents.get(call.call_id) or (
        render_success(output) if output is not None else render_failure(status, call.error)
    )
    extra: dict[str, Any] = {"refusal": call.refusal} if call.refusal else {}
    return ToolOutcome(
        status=status,
        output=output,
        error=call.error,
        elapsed_ms=call.elapsed_ms or 0,
        content=content,
        extra=extra,
    )
