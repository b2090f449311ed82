"""Typed responses of the REST API (the OpenAPI schema's components, as dataclasses).

Each keeps the JSON it was built from in `raw`, so a field the server adds later
is readable before this library names it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from datetime import datetime
from decimal import Decimal
from typing import Any


def parse_time(value: Any) -> datetime | None:
    if not value:
        return None
    text = str(value)
    # Python 3.10's fromisoformat does not read a trailing "Z".
    if text.endswith("Z"):
        text = text[:-1] + "+00:00"
    return datetime.fromisoformat(text)


def _decimal(value: Any) -> Decimal:
    return Decimal(str(value)) if value not in (None, "") else Decimal(0)


@dataclass(frozen=True)
class Agent:
    slug: str
    name: str
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    # Its latest configuration version (an evaluation's candidate names "<slug>@<version>").
    version: int | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Agent:
        return cls(
            slug=data["slug"], name=data.get("name", ""), raw=data, version=data.get("version")
        )


@dataclass(frozen=True)
class Usage:
    """A session's model usage."""

    input_tokens: int
    output_tokens: int
    cost: Decimal

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Usage:
        data = data or {}
        return cls(
            input_tokens=int(data.get("input_tokens", 0)),
            output_tokens=int(data.get("output_tokens", 0)),
            cost=_decimal(data.get("cost")),
        )


@dataclass(frozen=True)
class WorkflowRun:
    """A workflow run's version and where it stands (`Session.workflow`)."""

    slug: str
    version: int
    active: list[str]
    result: Any = None  # the run's result once it reached `end`
    error: Any = None  # {"node", "message"} once a node failed for good

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WorkflowRun:
        return cls(
            slug=str(data.get("slug", "")),
            version=int(data.get("version", 0)),
            active=list(data.get("active") or []),
            result=data.get("result"),
            error=data.get("error"),
        )


@dataclass(frozen=True)
class Session:
    id: str
    agent: str
    role: str
    state: str
    version: int
    turn: int
    queued_count: int
    metadata: dict[str, Any]
    usage: Usage
    last_error: str
    value: float
    created_at: datetime | None
    updated_at: datetime | None
    # Opened by a stateless OpenAI-compatible request: pruned once idle a while.
    ephemeral: bool = False
    # How the last turn that ended went; None before any turn ended.
    last_turn: LastTurn | None = None
    # A workflow run's version and where it stands; None for a conversation.
    workflow: WorkflowRun | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Session:
        return cls(
            id=str(data["id"]),
            agent=data.get("agent", ""),
            role=data.get("role", ""),
            state=data.get("state", ""),
            version=int(data.get("version", 0)),
            turn=int(data.get("turn", 0)),
            queued_count=int(data.get("queued_count", 0)),
            metadata=data.get("metadata") or {},
            usage=Usage.from_dict(data.get("usage")),
            last_error=data.get("last_error") or "",
            value=float(data.get("value") or 0),
            created_at=parse_time(data.get("created_at")),
            updated_at=parse_time(data.get("updated_at")),
            ephemeral=bool(data.get("ephemeral")),
            last_turn=LastTurn.from_dict(data["last_turn"]) if data.get("last_turn") else None,
            workflow=WorkflowRun.from_dict(data["workflow"]) if data.get("workflow") else None,
            raw=data,
        )


@dataclass(frozen=True)
class TurnCalls:
    """A turn's tool calls by how they ended."""

    ok: int = 0  # ran and succeeded
    failed: int = 0  # ran and failed or timed out, or was held back
    rejected: int = 0  # rejected by an approver, or the turn ended before it ran
    expired: int = 0  # no approver decided before its deadline
    unpaid: int = 0  # the owner's credit points could not pay for it

    @classmethod
    def from_dict(cls, data: Any) -> TurnCalls:
        data = data if isinstance(data, dict) else {}
        return cls(**{f.name: int(data.get(f.name) or 0) for f in fields(cls)})

    @property
    def not_done(self) -> int:
        """Calls that did not run or did not succeed."""
        return self.failed + self.rejected + self.expired + self.unpaid


@dataclass(frozen=True)
class LastTurn:
    """`last_turn` of a session: the turn number, its outcome (ok | tool_failures | stopped |
    error) and its tool calls by how they ended, as its `turn.finished` carried them."""

    turn: int
    outcome: str
    calls: TurnCalls

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LastTurn:
        return cls(
            turn=int(data.get("turn") or 0),
            outcome=str(data.get("outcome") or ""),
            calls=TurnCalls.from_dict(data.get("calls")),
        )


@dataclass(frozen=True)
class Message:
    id: int
    seq: int | None  # None while the message waits for its turn (status "queued")
    turn: int
    role: str
    status: str
    content: str
    tool_calls: list[dict[str, Any]]
    tool_call_id: str
    name: str
    token_count: int
    idempotency_key: str | None
    created_at: datetime | None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Message:
        return cls(
            id=int(data["id"]),
            seq=data.get("seq"),
            turn=int(data.get("turn", 0)),
            role=data.get("role", ""),
            status=data.get("status", ""),
            content=data.get("content", ""),
            tool_calls=data.get("tool_calls") or [],
            tool_call_id=data.get("tool_call_id") or "",
            name=data.get("name") or "",
            token_count=int(data.get("token_count") or 0),
            idempotency_key=data.get("idempotency_key"),
            created_at=parse_time(data.get("created_at")),
            raw=data,
        )


@dataclass(frozen=True)
class PostedMessage:
    """The answer to a posted message: `created` is False when an idempotency key
    repeated an earlier post (HTTP 200 instead of 202), which returns the first message."""

    message: Message
    created: bool


@dataclass(frozen=True)
class CancelResult:
    cancelled: bool
    session: Session

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CancelResult:
        return cls(cancelled=bool(data["cancelled"]), session=Session.from_dict(data["session"]))


@dataclass(frozen=True)
class Checkpoint:
    step: int
    turn: int
    state: str
    message_seq: int
    fingerprint: str
    size_bytes: int
    created_at: datetime | None
    context: Any = field(repr=False)
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Checkpoint:
        return cls(
            step=int(data["step"]),
            turn=int(data.get("turn", 0)),
            state=data.get("state", ""),
            message_seq=int(data.get("message_seq") or 0),
            fingerprint=data.get("fingerprint", ""),
            size_bytes=int(data.get("size_bytes") or 0),
            created_at=parse_time(data.get("created_at")),
            context=data.get("context"),
            raw=data,
        )


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]
    result_description: str
    kind: str
    timeout_s: float
    side_effects: bool
    requires_approval: bool
    risk_level: int | None
    roles: list[str]
    credit_cost: int
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Tool:
        return cls(
            name=data["name"],
            description=data.get("description", ""),
            parameters=data.get("parameters") or {},
            result_description=data.get("result_description", ""),
            kind=data.get("kind", ""),
            timeout_s=float(data.get("timeout_s") or 0),
            side_effects=bool(data.get("side_effects")),
            requires_approval=bool(data.get("requires_approval")),
            risk_level=data.get("risk_level"),
            roles=list(data.get("roles") or []),
            credit_cost=int(data.get("credit_cost") or 0),
            raw=data,
        )


@dataclass(frozen=True)
class Credits:
    balance: int
    reserved: int
    daily_cap: int | None
    spent_today: int


@dataclass(frozen=True)
class Tokens:
    input: int
    output: int


@dataclass(frozen=True)
class OwnerUsage:
    """`GET /usage/`: the caller's credits, tokens and cost."""

    credits: Credits
    tokens: Tokens
    cost: Decimal
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> OwnerUsage:
        credits, tokens = data.get("credits") or {}, data.get("tokens") or {}
        return cls(
            credits=Credits(
                balance=int(credits.get("balance", 0)),
                reserved=int(credits.get("reserved", 0)),
                daily_cap=credits.get("daily_cap"),
                spent_today=int(credits.get("spent_today", 0)),
            ),
            tokens=Tokens(input=int(tokens.get("input", 0)), output=int(tokens.get("output", 0))),
            cost=_decimal(data.get("cost")),
            raw=data,
        )


@dataclass(frozen=True)
class Approval:
    id: str
    session: str
    kind: str  # tool_call | recovery_review
    tool: str
    arguments: Any
    edited_arguments: Any
    risk_level: int | None
    reason: str
    status: str  # pending | approved | rejected | expired | cancelled
    group: str
    requested_at: datetime | None
    deadline: datetime | None
    decided_by: str
    decided_at: datetime | None
    comment: str
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Approval:
        return cls(
            id=str(data["id"]),
            session=str(data.get("session", "")),
            kind=data.get("kind", ""),
            tool=data.get("tool", ""),
            arguments=data.get("arguments"),
            edited_arguments=data.get("edited_arguments"),
            risk_level=data.get("risk_level"),
            reason=data.get("reason", ""),
            status=data.get("status", ""),
            group=data.get("group", ""),
            requested_at=parse_time(data.get("requested_at")),
            deadline=parse_time(data.get("deadline")),
            decided_by=data.get("decided_by") or "",
            decided_at=parse_time(data.get("decided_at")),
            comment=data.get("comment") or "",
            raw=data,
        )


# Where a session's id is asked for, the Session itself will do.
SessionRef = str | Session


def session_ref(session: SessionRef) -> str:
    """The id of `session`, given as an id or as the Session."""
    return session.id if isinstance(session, Session) else str(session)
