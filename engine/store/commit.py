"""The step commit: one atomic write of everything a step produced.

Every write to a session's state goes through `step_commit`: one short
transaction that moves the state with a conditional UPDATE on `version` (and,
for a worker, on its lease), allocates message and event sequence numbers in
that same statement, inserts what the step produced and records the
`Transition`. Frames are published only after the commit.
"""

import json
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any
from uuid import UUID

from django.db import connection, transaction
from django.utils import timezone
from psycopg.types.json import Jsonb

from hooks.outbox import outbox_statement, outbox_wake
from observability.tracing import trace_id_of
from observability.turns import turn_ended
from record.event_limits import payload_capped, payload_max_bytes
from record.events import EventSpec, EventType, MessageCompleted, StateChanged
from record.models import (
    AgentVersion,
    Checkpoint,
    Event,
    Message,
    MessageStatus,
    ModelCall,
    Session,
    ToolCall,
    ToolCallStatus,
    Transition,
)
from record.publisher import Frame, make_frame, publish
from record.rows import (
    JsonbText,
    Statement,
    execute_batch,
    insert_rows,
    insert_statement,
    one_round_trip,
    update_statement,
)
from record.states import RUNNABLE, STARTS_TURN, State, Trigger, next_state
from runtime.faults import fault_point

MESSAGE_COLUMNS = (
    "session",
    "seq",
    "turn",
    "role",
    "status",
    "content",
    "tool_calls",
    "tool_call_id",
    "name",
    "data",
    "token_count",
    "token_counter",
    "idempotency_key",
    "extra_context",
    "turn_options",
    "created_at",
)
TOOL_CALL_COLUMNS = (
    "session",
    "turn",
    "step",
    "position",
    "call_id",
    "tool_name",
    "input",
    "status",
    "output",
    "error",
    "elapsed_ms",
    "coercions",
    "cached",
    "attempts",
    "dispatched_at",
    "probe_outcome",
    "idempotency_key",
    "client",
    "created_at",
    "finished_at",
)
# A call inserted with its result (a workflow node's read-only call, run in its node step)
# carries its assessed risk too, as the results' commit writes it for the others.
TOOL_CALL_RAN_COLUMNS = (*TOOL_CALL_COLUMNS, "risk_level", "risk_reason")
TOOL_CALL_RESULT_COLUMNS = (
    "status",
    "output",
    "error",
    "elapsed_ms",
    "finished_at",
    "coercions",
    "cached",
    "attempts",
    "probe_outcome",
    # The call's assessed risk rides on the results' commit (no write of its own).
    "risk_level",
    "risk_reason",
    # Why a call did not run (an approver, its deadline, the credits), for the turn's outcome.
    "refusal",
)
# A call that ran with an approver's edited arguments: what ran and what the model proposed,
# written by the same commit as its result (only for such calls: a statement of its own).
TOOL_CALL_EDITED_COLUMNS = ("input", "proposed_input")
MODEL_CALL_COLUMNS = (
    "session",
    "turn",
    "step",
    "endpoint",
    "endpoint_name",
    "api",
    "model",
    "input_tokens",
    "output_tokens",
    "tokens_estimated",
    "first_token_ms",
    "total_ms",
    "retried",
    "fallback_used",
    "rollout",
    "outcome",
    "error",
    "cost",
    "purpose",
    "tier",
    "tier_reason",
    "created_at",
)
EVENT_COLUMNS = ("session", "seq", "type", "data", "created_at")
TRANSITION_COLUMNS = (
    "session",
    "from_state",
    "to_state",
    "trigger",
    "reason",
    "version",
    "turn",
    "actor",
    "at",
)
CHECKPOINT_COLUMNS = (
    "session",
    "step",
    "turn",
    "state",
    "message_seq",
    "context",
    "size_bytes",
    "fingerprint",
    "created_at",
)

# Columns set to the step transaction's now().
NOW = ("created_at",)
# Every statement of a step's batch after its UPDATE writes only while this
# holds: the UPDATE sets the transaction-local mark only when it matched. One
# text for every step, so the server keeps each statement prepared
# (rows.execute_batch); a batch inside a caller's transaction, where an earlier
# step may have set the mark, clears it first (CLEAR_MARK).
MARK_SET = "set_config('agentplatform.step', 'on', true)"
GUARD = "current_setting('agentplatform.step', true) = 'on'"
CLEAR_MARK: Statement = ("SELECT set_config('agentplatform.step', '', true)", [])

# Columns a step may set directly or add to; anything else is a programming error.
SETTABLE = {
    "trace_parent",
    "cancel_requested",
    "cancel_reason",
    "cancel_actor",
    "iteration",
    "last_error",
    "lease_owner",
    "lease_expires_at",
    "turn",
    "turn_started_at",
    "timer_due_at",
    "timer_note",
    "resume_check",
    "env_fingerprint",
    "degradation_level",
    "dialogue_state",
    "workflow_state",
    # A handoff (engine/gates/handoff.py): the agent that decides from the next step on.
    "agent_id",
    # The step that ends a turn records its outcome (from its turn.finished).
    "last_turn_number",
    "last_turn_outcome",
    "last_turn_calls",
}
ADDABLE = {"input_tokens", "output_tokens", "cost", "queued_count"}


# The agent's configuration stamp, returned by every commit's UPDATE: the run cache
# (engine/run_cache.py) validates its copy of the agent for the next step without a query.
STAMP_RETURNING = f'agent_config_stamp("{Session._meta.db_table}"."agent_id")'

# The agent's latest configuration version (the unique agentversion_number serves it):
# a turn's first step and a handoff record what the turn runs on, in the same UPDATE, so
# the record names "support@5" with no write of its own. The agent is the row's own
# (SET reads the old row) or, for a handoff, the new agent's id as a parameter.
_VERSION_OF = (
    f"agent_version_id = (SELECT v.id FROM {AgentVersion._meta.db_table} v "  # nosec B608
    "WHERE v.agent_id = {agent} ORDER BY v.number DESC LIMIT 1)"
)


@dataclass(frozen=True)
class CallsCommitted:
    """What one commit did to the tool calls of its turn, for the run's loop guards
    (run_cache.RunContext): from which version to which, and each call it
    inserted or updated as (step, position, idempotency key, tool, input, output, status,
    refusal)."""

    before: int
    after: int
    turn: int
    new_turn: bool
    calls: tuple[tuple[int, int, str, str, Any, Any, str, str], ...]


class StaleSession(Exception):
    """The session moved on (another version, or our lease was taken); nothing was written."""


@dataclass
class Step:
    """What one atomic phase of a run writes."""

    session: Session
    trigger: Trigger | None = None
    # A second move made in the same commit (tool results -> the model decides
    # again): its own transition and state.changed, no commit of its own.
    then: Trigger | None = None
    reason: str = ""
    actor: str = ""
    messages: list[Message] = field(default_factory=list)
    activate_message: Message | None = None
    new_tool_calls: list[ToolCall] = field(default_factory=list)
    updated_tool_calls: list[ToolCall] = field(default_factory=list)
    model_calls: list[ModelCall] = field(default_factory=list)
    events: list[EventSpec] = field(default_factory=list)
    after_events: list[EventSpec] = field(default_factory=list)
    checkpoint: dict[str, Any] | None = None
    set_fields: dict[str, Any] = field(default_factory=dict)
    add_fields: dict[str, int | Decimal] = field(default_factory=dict)
    lease_owner: str | None = None
    lease_seconds: float | None = None
    fingerprint: str = ""
    # Refuse to commit (StaleSession) if a cancel was requested meanwhile; the
    # flag is set without a version bump, so only this guard sees it.
    unless_cancel_requested: bool = False
    # A summary among `messages` replaced the history up to this seq: those
    # messages are marked archived (never deleted) in the same transaction.
    archive_through: int | None = None
    # A read run after the writes, in the same round trip and transaction (it
    # sees them): what the next step would read first (open_calls.py). Its
    # rows come back in `Committed.read`.
    then_read: Statement | None = None
    # Usage rollups and credit settlements, worked out by the move from the calls the
    # step records (engine/moves/metering.py): the store writes them, knowing no billing.
    charges: list[Statement | None] = field(default_factory=list)
    # Where each of `messages`' message.completed goes among `events` (an index into
    # `events`, one per message, in order): a step whose events tell a story of their own
    # (a workflow's node step: node.started, the call's result, node.finished, the answer)
    # places its messages in it, and its move follows them, as it happened. None: the move
    # first, then the messages, then the events.
    message_slots: list[int] | None = None


@dataclass(frozen=True)
class Committed:
    version: int
    state: State
    step: int
    frames: list[Frame]
    read: list[tuple[Any, ...]] | None = None


def _message_event(message: Message, seq: int, turn: int) -> EventSpec:
    data: MessageCompleted = {
        "seq": seq,  # numbered by the step that completes it
        "role": message.role,
        "content": message.content,
        "turn": turn,
    }
    if message.tool_calls:
        data["tool_calls"] = message.tool_calls
    if message.role == "tool":
        data["tool_call_id"] = message.tool_call_id
        data["name"] = message.name
    return EventSpec(EventType.MESSAGE_COMPLETED, data)


def _in_slots(
    messages: list[EventSpec],
    slots: list[int],
    events: list[EventSpec],
    *,
    activated: list[EventSpec],
) -> list[EventSpec]:
    """`events` with each message's event placed before the event its slot names (after
    them all for a slot past their end)."""
    if len(slots) != len(messages):
        raise ValueError(f"{len(messages)} messages but {len(slots)} message slots")
    ordered = list(activated)
    placed = 0
    for i, spec in enumerate(events):
        while placed < len(messages) and slots[placed] <= i:
            ordered.append(messages[placed])
            placed += 1
        ordered.append(spec)
    return ordered + messages[placed:]


def _frames(session_id: UUID, first: int, events: list[EventSpec], ts: Any) -> list[Frame]:
    return [
        make_frame(session_id, first + i + 1, type_, data, ts)
        for i, (type_, data) in enumerate(events)
    ]


def _publish_after_commit(session_id: UUID | str, frames: list[Frame], texts: list[str]) -> None:
    fault_point("after_commit_before_publish")
    publish(session_id, frames, texts)


def model_calls_number(step: Step) -> int:
    """Give the step's model calls their session and the step number this commit gives the
    step (its checkpoint's), and return that number; the same whoever calls it first."""
    number = step.session.step + (1 if step.checkpoint is not None else 0)
    for record in step.model_calls:
        record.session_id = step.session.pk
        record.step = number
    return number


@dataclass(frozen=True)
class _Plan:
    """The step worked out before its one round trip: its moves and what the row's
    counters become if the UPDATE matches (its WHERE pins their current values, so every
    number is known up front and no write has to wait for RETURNING)."""

    moves: list[tuple[State, State, Trigger]]
    to_state: State
    activated: list[Message]
    new_messages: list[Message]
    version: int
    message_seq: int
    event_seq: int
    step_no: int
    turn: int

    @property
    def first_message_seq(self) -> int:
        """The seq before the step's first message (activated ones come first)."""
        return self.message_seq - len(self.activated) - len(self.new_messages)


def _plan(
    step: Step, moves: list[tuple[State, State, Trigger]], to_state: State, n_events: int
) -> _Plan:
    session = step.session
    activated = [step.activate_message] if step.activate_message is not None else []
    new_messages = list(step.messages)
    return _Plan(
        moves=moves,
        to_state=to_state,
        activated=activated,
        new_messages=new_messages,
        version=session.version + max(len(moves), 1),
        message_seq=session.message_seq + len(activated) + len(new_messages),
        event_seq=session.event_seq + n_events,
        step_no=model_calls_number(step),
        turn=step.set_fields.get("turn", session.turn),
    )


def _moves(step: Step) -> tuple[list[tuple[State, State, Trigger]], State]:
    """The step's moves (none, its trigger, or its trigger and `then`) and where they end."""
    from_state = State(step.session.state)
    if not step.trigger:
        return [], from_state
    moves = [(from_state, next_state(from_state, step.trigger), step.trigger)]
    if step.then:
        after = moves[-1][1]
        moves.append((after, next_state(after, step.then), step.then))
    return moves, moves[-1][1]


def _state_events(step: Step, moves: list[tuple[State, State, Trigger]]) -> list[EventSpec]:
    trace_id = trace_id_of(step.set_fields.get("trace_parent", step.session.trace_parent))
    events: list[EventSpec] = []
    for i, (before, after, trigger) in enumerate(moves):
        moved: StateChanged = {
            "from": before.value,
            "to": after.value,
            "trigger": trigger.value,
            "reason": step.reason if i == 0 else "",
        }
        if trace_id:
            moved["trace_id"] = trace_id
        events.append(EventSpec(EventType.STATE_CHANGED, moved))
    return events


def _lease_assignments(step: Step, to_state: State) -> tuple[list[str], list[Any]]:
    """The lease's columns: renewed, or given back by the run's last commit."""
    if (
        step.lease_owner is not None
        and to_state not in RUNNABLE
        and not {"lease_owner", "lease_expires_at"} & step.set_fields.keys()
    ):
        # The run's last commit gives its lease back, on lease_release's condition (nothing
        # left to run: no message queued for a state that starts a turn), judged on the row
        # as this UPDATE leaves it: the run ends with no round trip of its own.
        if to_state in STARTS_TURN:
            hold = "queued_count + %s > 0"
            held = [int(step.add_fields.get("queued_count", 0))]
        else:
            hold, held = "false", []
        owner = f"lease_owner = CASE WHEN {hold} THEN lease_owner END"
        if step.lease_seconds is not None:
            expiry = (
                f"lease_expires_at = CASE WHEN {hold} THEN now() + make_interval(secs => %s) END"
            )
            return [owner, expiry], [*held, *held, step.lease_seconds]
        expiry = f"lease_expires_at = CASE WHEN {hold} THEN lease_expires_at END"
        return [owner, expiry], [*held, *held]
    if step.lease_seconds is not None:
        return ["lease_expires_at = now() + make_interval(secs => %s)"], [step.lease_seconds]
    return [], []


def _session_update(step: Step, plan: _Plan) -> Statement:
    """The one UPDATE that moves the row, guarded on its version (and the lease)."""
    session = step.session
    assignments = [
        "state = %s",
        "version = %s",
        "message_seq = %s",
        "event_seq = %s",
        "step = %s",
        "updated_at = now()",
    ]
    params: list[Any] = [
        plan.to_state.value,
        plan.version,
        plan.message_seq,
        plan.event_seq,
        plan.step_no,
    ]
    for name, value in step.set_fields.items():
        if name not in SETTABLE:
            raise ValueError(f"step may not set {name}")
        assignments.append(f"{name} = %s")
        # A JSON column's value (dialogue_state) is sent as jsonb.
        params.append(Jsonb(value) if isinstance(value, dict) else value)
    if "agent_id" in step.set_fields:
        assignments.append(_VERSION_OF.format(agent="%s"))
        params.append(step.set_fields["agent_id"])
    elif "turn" in step.set_fields:
        assignments.append(_VERSION_OF.format(agent=f'"{Session._meta.db_table}"."agent_id"'))
    for name, value in step.add_fields.items():
        if name not in ADDABLE:
            raise ValueError(f"step may not add to {name}")
        assignments.append(f"{name} = {name} + %s")
        params.append(value)
    lease, lease_params = _lease_assignments(step, plan.to_state)
    assignments += lease
    params += lease_params
    where = "id = %s AND version = %s AND message_seq = %s AND event_seq = %s AND step = %s"
    params += [session.pk, session.version, session.message_seq, session.event_seq, session.step]
    if step.lease_owner is not None:
        where += " AND lease_owner = %s"
        params.append(step.lease_owner)
    if step.unless_cancel_requested:
        where += " AND NOT cancel_requested"
    return (
        # SQL names from model metadata (constants); every value is a bound parameter.
        f"UPDATE {Session._meta.db_table} SET {', '.join(assignments)} WHERE {where} "
        "RETURNING now(), cancel_requested, queued_count, lease_owner, "
        f"{MARK_SET}, {STAMP_RETURNING}",  # nosec B608
        params,
    )


def _message_writes(step: Step, plan: _Plan) -> list[Statement | None]:
    """The new messages (numbered; right after the UPDATE, their ids come back from that
    result), the activated ones and the archive mark."""
    session = step.session
    first_new = plan.first_message_seq + len(plan.activated) + 1
    for seq, message in enumerate(plan.new_messages, start=first_new):
        message.seq = seq
        message.session_id = session.pk
    writes: list[Statement | None] = [
        insert_statement(
            Message, plan.new_messages, MESSAGE_COLUMNS, returning=True, guard=GUARD, now=NOW
        )
    ]
    for seq, message in enumerate(plan.activated, start=plan.first_message_seq + 1):
        writes.append(
            (
                # SQL names from model metadata (constants); every value is a bound parameter.
                f'UPDATE "{Message._meta.db_table}" SET seq = %s, status = %s, turn = %s '
                f"WHERE id = %s AND {GUARD}",  # nosec B608
                [seq, MessageStatus.FINAL.value, plan.turn, message.pk],
            )
        )
    if step.archive_through is not None:
        writes.append(
            (
                # The table from model metadata, the guard a constant clause; values are bound.
                f'UPDATE "{Message._meta.db_table}" SET archived_at = now() '  # nosec B608
                f"WHERE session_id = %s AND seq <= %s AND archived_at IS NULL AND {GUARD}",
                [session.pk, step.archive_through],
            )
        )
    return writes


def _call_writes(step: Step) -> list[Statement | None]:
    """The tool calls it opens, runs or finishes and the model calls it made."""
    for call in step.new_tool_calls:
        call.session_id = step.session.pk
    intents = [c for c in step.new_tool_calls if c.status == ToolCallStatus.EXECUTING]
    ran = [c for c in step.new_tool_calls if c.status != ToolCallStatus.EXECUTING]
    edited = [c for c in step.updated_tool_calls if c.proposed_input is not None]
    return [
        insert_statement(ToolCall, intents, TOOL_CALL_COLUMNS, guard=GUARD, now=NOW),
        insert_statement(ToolCall, ran, TOOL_CALL_RAN_COLUMNS, guard=GUARD, now=NOW),
        update_statement(ToolCall, step.updated_tool_calls, TOOL_CALL_RESULT_COLUMNS, guard=GUARD),
        update_statement(ToolCall, edited, TOOL_CALL_EDITED_COLUMNS, guard=GUARD),
        insert_statement(ModelCall, step.model_calls, MODEL_CALL_COLUMNS, guard=GUARD, now=NOW),
    ]


def _ordered_events(
    step: Step, plan: _Plan, state_events: list[EventSpec]
) -> tuple[list[EventSpec], list[str]]:
    """The step's events in the order they happened, and each one's payload dumped once:
    the same text is the row's jsonb parameter and the published frame's `data`."""
    n_activated = len(plan.activated)
    message_events = [
        # An activated (queued) message joins the step's turn; the object itself
        # changes only once the commit went through.
        _message_event(m, s, plan.turn if i < n_activated else m.turn)
        for i, (s, m) in enumerate(
            enumerate(plan.activated + plan.new_messages, start=plan.first_message_seq + 1)
        )
    ]
    if step.message_slots is None:
        # The move first, then what it brought: a turn's stream opens with
        # state.changed and closes with turn.finished.
        ordered = state_events + message_events + step.events + step.after_events
    else:
        ordered = _in_slots(
            message_events[n_activated:],
            step.message_slots,
            step.events,
            activated=message_events[:n_activated],
        )
        ordered += state_events + step.after_events
    texts = [json.dumps(data) for _, data in ordered]
    limit = payload_max_bytes()
    for i, text in enumerate(texts):
        if len(text) > limit:
            # No event may break the websocket (record/event_limits.py): cut it here.
            ordered[i], texts[i] = payload_capped(ordered[i], text)
    return ordered, texts


def _record_writes(
    step: Step, plan: _Plan, ordered: list[EventSpec], texts: list[str]
) -> list[Statement | None]:
    """Events, transitions and the checkpoint: only written, as rows of values in their
    columns' order (no model instances)."""
    session = step.session
    first = plan.event_seq - len(ordered)
    events = [
        (session.pk, first + i + 1, type_, JsonbText(text))
        for i, ((type_, _), text) in enumerate(zip(ordered, texts, strict=True))
    ]
    transitions = [
        (
            session.pk,
            before.value,
            after.value,
            trigger.value,
            step.reason[:2000] if i == 0 else "",
            # Each move its own version: the last one is the row's.
            plan.version - len(plan.moves) + 1 + i,
            plan.turn,
            step.actor[:150] if i == 0 else "",
        )
        for i, (before, after, trigger) in enumerate(plan.moves)
    ]
    writes = [
        insert_rows(Event, events, EVENT_COLUMNS, guard=GUARD, now=NOW),
        insert_rows(Transition, transitions, TRANSITION_COLUMNS, guard=GUARD, now=("at",)),
    ]
    if step.checkpoint is not None:
        # Dumped once: its text is both the jsonb parameter and the recorded size.
        context = json.dumps(
            {**step.checkpoint, "state": plan.to_state.value}, separators=(",", ":")
        )
        checkpoint = (
            session.pk,
            plan.step_no,
            plan.turn,
            plan.to_state.value,
            plan.message_seq,
            JsonbText(context),
            len(context),
            step.fingerprint,
        )
        writes.append(
            insert_rows(Checkpoint, [checkpoint], CHECKPOINT_COLUMNS, guard=GUARD, now=NOW)
        )
    return writes


def _run_batch(
    session: Session, writes: list[Statement | None], ordered: list[EventSpec], texts: list[str]
) -> tuple[list[list[tuple[Any, ...]] | None], list[Frame]]:
    """Send the batch in one round trip and publish its frames once it committed; raise
    StaleSession when its UPDATE matched nothing (then nothing was written).

    Outside a transaction the server runs the batch as one implicit transaction (all of it
    commits, or none); nested (message_post, fork), the step is all of the caller's
    transaction or none of it.
    """
    session_id = session.pk
    first = session.event_seq  # the row's before this step
    frames: list[Frame] = []
    if connection.in_atomic_block or not one_round_trip():
        nested = connection.in_atomic_block
        with transaction.atomic(savepoint=False):
            results = execute_batch([CLEAR_MARK, *writes] if nested else writes, prepare=True)
            if nested:
                results = results[1:]
            row = results[0][0] if results[0] else None
            if row is not None:
                frames = _frames(session_id, first, ordered, row[0])
                transaction.on_commit(lambda: _publish_after_commit(session_id, frames, texts))
    else:
        results = execute_batch(writes, prepare=True)
        row = results[0][0] if results[0] else None
        if row is not None:
            frames = _frames(session_id, first, ordered, row[0])
            _publish_after_commit(session_id, frames, texts)
    # A refused move wrote nothing, and a caller's own transaction stays
    # usable after it catches StaleSession.
    if row is None:
        raise StaleSession(f"session {session_id} is no longer at version {session.version}")
    return results, frames


def _calls_committed(step: Step, plan: _Plan) -> CallsCommitted:
    return CallsCommitted(
        before=step.session.version,
        after=plan.version,
        turn=plan.turn,
        new_turn=plan.turn != step.session.turn,
        calls=tuple(
            (
                c.step,
                c.position,
                c.idempotency_key,
                c.tool_name,
                c.input,
                c.output,
                c.status,
                c.refusal,
            )
            for c in (*step.new_tool_calls, *step.updated_tool_calls)
            if c.turn == plan.turn
        ),
    )


def _caught_up(step: Step, plan: _Plan, results: list[list[tuple[Any, ...]] | None]) -> None:
    """Keep the caller's objects in step with the rows they now match."""
    session = step.session
    now, cancel_requested, queued_count, lease_owner, _, stamp = results[0][0]  # type: ignore[index]
    for seq, message in enumerate(plan.activated, start=plan.first_message_seq + 1):
        message.seq, message.status, message.turn = seq, MessageStatus.FINAL, plan.turn
    if plan.new_messages:
        for message, (pk,) in zip(plan.new_messages, results[1] or [], strict=True):
            message.pk = pk
            message.created_at = now
    for call in step.new_tool_calls:
        call.created_at = now
    for record in step.model_calls:
        record.created_at = now
    # For the run's history (runtime_cache.RunContext): no re-read of what it just wrote.
    session.committed_messages = [  # type: ignore[attr-defined]
        *getattr(session, "committed_messages", ())[-100:],
        *plan.activated,
        *plan.new_messages,
    ]
    # For the run's loop guards: every commit is logged (a gap in the versions
    # sends the run back to the database), with the calls it wrote.
    session.committed_calls = [  # type: ignore[attr-defined]
        *getattr(session, "committed_calls", ())[-100:],
        _calls_committed(step, plan),
    ]
    session.version = plan.version
    session.state = plan.to_state.value
    session.cancel_requested = cancel_requested
    session.queued_count = queued_count
    session.lease_owner = lease_owner
    session.message_seq = plan.message_seq
    session.event_seq = plan.event_seq
    session.step = plan.step_no
    for name, value in step.set_fields.items():
        setattr(session, name, value)
    for name, value in step.add_fields.items():
        if name != "queued_count":  # already the committed value, from RETURNING
            setattr(session, name, getattr(session, name) + value)
    session.updated_at = now or timezone.now()
    session.config_stamp = (plan.version, stamp)  # type: ignore[attr-defined]


def step_commit(step: Step) -> Committed:
    """Commit one step, or raise StaleSession (or IllegalTransition) having changed nothing.

    1. Work out the move from the in-memory state (valid because the UPDATE
       below only matches that exact version).
    2. One UPDATE moves state and version, renews the lease and allocates the
       message, event and step numbers; RETURNING gives them back.
    3. Insert messages, tool calls, events, the transition and the checkpoint.
    4. After commit, publish the frames.
    """
    moves, to_state = _moves(step)
    state_events = _state_events(step, moves)
    n_messages = len(step.messages) + (step.activate_message is not None)
    n_events = n_messages + len(step.events) + len(state_events) + len(step.after_events)
    plan = _plan(step, moves, to_state, n_events)
    ordered, texts = _ordered_events(step, plan, state_events)
    writes = [
        _session_update(step, plan),
        *_message_writes(step, plan),
        *_call_writes(step),
        *_record_writes(step, plan, ordered, texts),
        # Usage rollups and credit settlements ride in the same transaction, last: their
        # rows (the owner's day, agent and tools; the credit account) are shared by every
        # session of the owner, and a row lock is held until the commit, so each step
        # holds them only for its commit, not while the rest of the batch runs.
        *step.charges,
    ]
    # A run webhook's delivery (hooks/outbox.py) commits with the turn's end, or not at all.
    finished = next((s for s in step.after_events if s.type == EventType.TURN_FINISHED), None)
    if finished is not None:
        writes.append(outbox_statement(step.session.pk, plan.turn, dict(finished.data), GUARD))
    if step.then_read is not None:
        writes.append(step.then_read)  # last: its rows are the batch's last result
    results, frames = _run_batch(step.session, writes, ordered, texts)
    if finished is not None:
        outbox_wake(results[-2 if step.then_read is not None else -1])
    for spec in step.after_events:
        if spec.type == EventType.TURN_FINISHED:
            turn_ended(step.session.pk, str(spec.data.get("stop_reason", "")))
    _caught_up(step, plan, results)
    read = results[-1] if step.then_read is not None else None
    return Committed(
        version=plan.version, state=plan.to_state, step=plan.step_no, frames=frames, read=read
    )
