"""What an operator reads before acting on a session: what happened at each checkpoint, what a
fork from one would copy and may repeat, and what running a tool by hand would do.

Reads only: the actions themselves are the services' (sessions/services/fork.py, operator.py).
"""

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db.models import Q

from approvals.policy import approval_reason
from billing.selectors import CreditsCheck, credits_cover
from record.errors import NotFound
from record.models import Checkpoint, Message, MessageStatus, Session, ToolCall
from tools.execution import ToolSnapshot, tools_for_agent, validator_for
from tools.models import Tool
from tools.risk import assess_risk
from tools.validation import check_arguments

PREVIEW_CHARS = 140


def _short(text: str, limit: int = PREVIEW_CHARS) -> str:
    flat = " ".join((text or "").split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


@dataclass
class CheckpointStory:
    """What happened at one checkpoint's step, in a line an operator can choose by."""

    phase: str
    # The calls the step asked for (`refund, lookup`) or closed (`refund=success`).
    tools: str
    # The last message the checkpoint covers: who said it, and its start.
    message_role: str
    message_text: str
    message_seq: int
    at: datetime

    @property
    def what(self) -> str:
        return f"{self.phase.replace('_', ' ')}" + (f": {self.tools}" if self.tools else "")


def message_line(message: Message) -> str:
    if message.content:
        return _short(message.content)
    names = [str(c.get("name", "?")) for c in message.tool_calls or [] if isinstance(c, dict)]
    return "asks for " + ", ".join(names) if names else ""


def checkpoints_described(checkpoints: Iterable[Checkpoint]) -> dict[int, CheckpointStory]:
    """Each checkpoint's story (three queries for a whole page of them)."""
    rows = list(checkpoints)
    if not rows:
        return {}
    done_ids = {
        (cp.session_id, str(item[0]))
        for cp in rows
        for item in (cp.context or {}).get("done") or []
        if isinstance(item, list) and item
    }
    calls = ToolCall.objects.filter(
        Q(session_id__in={cp.session_id for cp in rows}, step__in={cp.step for cp in rows})
        | Q(
            session_id__in={s for s, _ in done_ids} or [None],
            call_id__in={c for _, c in done_ids} or [""],
        )
    ).only("session_id", "step", "position", "call_id", "tool_name", "status")
    by_step: dict[tuple[Any, int], list[ToolCall]] = {}
    by_id: dict[tuple[Any, str], ToolCall] = {}
    for call in sorted(calls, key=lambda c: (c.step, c.position)):
        by_step.setdefault((call.session_id, call.step), []).append(call)
        by_id[(call.session_id, call.call_id)] = call
    wanted = Q()
    for cp in rows:
        wanted |= Q(session_id=cp.session_id, seq=cp.message_seq)
    messages = {
        (m.session_id, m.seq): m
        for m in Message.objects.filter(wanted).only(
            "session_id", "seq", "role", "name", "content", "tool_calls"
        )
    }
    stories: dict[int, CheckpointStory] = {}
    for cp in rows:
        context = cp.context if isinstance(cp.context, dict) else {}
        closed = [
            by_id.get((cp.session_id, str(item[0])))
            for item in context.get("done") or []
            if isinstance(item, list) and item
        ]
        if any(closed):
            tools = ", ".join(f"{c.tool_name}={c.status}" for c in closed if c is not None)
        else:
            tools = ", ".join(c.tool_name for c in by_step.get((cp.session_id, cp.step), []))
        message = messages.get((cp.session_id, cp.message_seq))
        stories[cp.pk] = CheckpointStory(
            phase=str(context.get("phase") or cp.state),
            tools=tools,
            message_role=(message.role + (f" ({message.name})" if message.name else ""))
            if message
            else "",
            message_text=message_line(message) if message else "",
            message_seq=cp.message_seq,
            at=cp.created_at,
        )
    return stories


@dataclass
class RepeatableCall:
    """A call of the source after the fork point: a continued run may make it again."""

    call: ToolCall
    side_effects: bool

    @property
    def took_effect(self) -> bool:
        return self.call.status == "success" and self.side_effects

    @property
    def arguments(self) -> str:
        return _short(json.dumps(self.call.input, ensure_ascii=False, default=str), 160)


@dataclass
class ForkPreview:
    source: Session
    checkpoint: Checkpoint
    story: CheckpointStory
    # The last messages the fork copies (the model reads them next), oldest first, each
    # with its line (what was said, or the calls asked for).
    copied: list[tuple[Message, str]]
    copied_count: int
    # A trailing tool request whose results lie beyond the checkpoint: not copied.
    dropped_request: bool
    # Whether the fork's model (or graph) goes on at once, or it waits for the user.
    decides: bool
    calls_after: list[RepeatableCall] = field(default_factory=list)

    @property
    def side_effects(self) -> list[RepeatableCall]:
        return [c for c in self.calls_after if c.side_effects]

    @property
    def read_only_count(self) -> int:
        return sum(1 for c in self.calls_after if not c.side_effects)

    @property
    def active_nodes(self) -> list[str]:
        state = (self.checkpoint.context or {}).get("workflow") or {}
        return [str(n) for n in state.get("active") or []] if isinstance(state, dict) else []


def fork_preview(*, session: Session, step: int, shown: int = 6) -> ForkPreview:
    """What forking `session` at checkpoint `step` copies, and the calls after it that a
    continued run may repeat (the side-effecting ones first: they took effect once)."""
    checkpoint = Checkpoint.objects.filter(session=session, step=step).first()
    if checkpoint is None:
        raise NotFound(
            f"session {session.pk} has no checkpoint {step}", details={"field": "checkpoint"}
        )
    history = list(
        Message.objects.filter(
            session=session, status=MessageStatus.FINAL, seq__lte=checkpoint.message_seq
        )
        .order_by("-seq")
        .only("seq", "role", "name", "content", "tool_calls", "created_at")[: shown + 1]
    )
    history.reverse()
    dropped = bool(history) and history[-1].role == "assistant" and bool(history[-1].tool_calls)
    kept = history[:-1] if dropped else history
    count = Message.objects.filter(
        session=session, status=MessageStatus.FINAL, seq__lte=checkpoint.message_seq
    ).count() - (1 if dropped else 0)
    # A call is "after" the fork point when its result is not in the copied history.
    results = dict(
        Message.objects.filter(session=session, role="tool", seq__lte=checkpoint.message_seq)
        .exclude(tool_call_id="")
        .values_list("tool_call_id", "seq")
    )
    later = [
        c
        for c in ToolCall.objects.filter(session=session, step__gte=checkpoint.step).order_by(
            "step", "position"
        )
        if c.call_id not in results
    ]
    effects = set(
        Tool.objects.filter(name__in={c.tool_name for c in later}, side_effects=True).values_list(
            "name", flat=True
        )
    )
    calls_after = [
        RepeatableCall(c, c.tool_name in effects or c.dispatched_at is not None) for c in later
    ]
    calls_after.sort(key=lambda r: (not r.side_effects, r.call.step, r.call.position))
    story = checkpoints_described([checkpoint])[checkpoint.pk]
    decides = session.workflow_version_id is not None or (
        bool(kept) and kept[-1].role in ("user", "tool", "system")
    )
    return ForkPreview(
        source=session,
        checkpoint=checkpoint,
        story=story,
        copied=[(m, message_line(m)) for m in kept[-shown:]],
        copied_count=max(count, 0),
        dropped_request=dropped,
        decides=decides,
        calls_after=calls_after,
    )


@dataclass
class ToolRunPreview:
    """What running `tool` by hand with `arguments` would do, before it is confirmed."""

    session: Session
    tool: ToolSnapshot
    arguments: dict[str, Any]
    errors: list[str]
    risk_level: int
    risk_why: str
    approval: str | None
    credit_cost: int
    # Whether the owner can pay for it now (None: the tool costs nothing).
    credits: CreditsCheck | None


def tool_run_preview(*, session: Session, tool_name: str, arguments: Any) -> ToolRunPreview:
    """The tool's schema check, its risk assessment (before the failure-rate bump the tool
    step may add), whether an approver must decide, and what it costs the owner."""
    tools = tools_for_agent(list(session.agent.tools), role=session.role)
    tool = tools.get(tool_name)
    if tool is None:
        raise NotFound(
            f"tool {tool_name!r} is not available to this session's agent and role",
            details={"field": "tool", "available": sorted(tools)},
        )
    args = arguments if isinstance(arguments, dict) else {}
    checked = check_arguments(validator_for(tool), args)
    risk = assess_risk(tool, args)
    credits = (
        credits_cover(owner_id=session.owner_id, points=tool.credit_cost)
        if tool.credit_cost
        else None
    )
    return ToolRunPreview(
        session=session,
        tool=tool,
        arguments=args,
        errors=list(checked.errors),
        risk_level=risk.level,
        risk_why=risk.why,
        approval=approval_reason(tool, args, risk.level, risk.why),
        credit_cost=tool.credit_cost,
        credits=credits,
    )
