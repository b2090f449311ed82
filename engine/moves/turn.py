"""Every change of a session's state, each as one step: the moves of the state machine.

The phases (model, tools) and the run loop decide which move to make; the
services call the ones an edge may trigger (start a turn, cancel, wake a timer,
resume, fork) through the engine's public surface. Each move builds one `Step`
and hands it to `metered_commit` (the store's `step_commit` with its charges);
nothing else in the code base writes a session's state.
"""

from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.utils import timezone

from approvals.models import WORKFLOW_REVIEW_PREFIX
from engine.gates.guards import canonical_json
from engine.model.context import tool_calls_json
from engine.model.environment import fingerprint as env_fingerprint
from engine.model.usage import ModelSpend, Usage
from engine.moves.metering import step_metering
from engine.store import commit as store
from engine.store.commit import GUARD, Committed, StaleSession, Step
from engine.store.open_calls import finished_keep, open_calls_statement, prefetched_keep
from engine.store.turn_calls import turn_calls_counted
from llm.types import ToolCallRequest
from memory.tokens import count_message_tokens
from observability import metrics, tracing
from observability.redaction import scrub
from record.dispatch import run_enqueue_on_commit
from record.events import (
    AgentChanged,
    CallCounts,
    EventSpec,
    EventType,
    Progress,
    StopReason,
    ToolFinished,
    ToolStarted,
    TurnFinished,
    call_counts,
    turn_outcome,
)
from record.models import Message, MessageStatus, ModelCall, Session, ToolCall, ToolCallStatus
from record.states import RUNNABLE, TURN_ENDED, State, Trigger
from tools.execution import ToolOutcome, ToolSnapshot, outcome_within_limit
from tools.rendering import render_failure

if TYPE_CHECKING:
    from engine.gates.client_tools import ClientWait
    from engine.gates.handoff import HandoffTo
    from engine.gates.questions import Question

INTERRUPT_REASON = "interrupted by a new message"
TIMER_HANDLER = "builtin.schedule_followup"
# A call an operator runs by hand (engine/moves/takeover.py) has an id with this prefix.
OPERATOR_CALL_PREFIX = "op_"


def operator_call(call: ToolCall) -> bool:
    """The call was run by hand by an operator, not asked for by the model."""
    return call.call_id.startswith(OPERATOR_CALL_PREFIX)


def metered_commit(step: Step) -> Committed:
    """Commit a move's step, with its usage rollups and credit settlements riding on it.

    The store knows no billing: the statements are worked out here from the calls the step
    records, and the store writes them last, in the same transaction.
    """
    store.model_calls_number(step)  # the charges name each model call by its step
    # Calls with their result: those the step finishes, and those it inserts already run
    # (a workflow node's read-only call, run in its node step; new intents are executing).
    finished = [*step.new_tool_calls, *step.updated_tool_calls]
    step.charges = step_metering(step.session, step.model_calls, finished, GUARD)
    for spec in step.after_events:
        if spec.type == EventType.TURN_FINISHED:
            # The turn's outcome on the row too, for the lists: from the event, so they agree.
            step.set_fields.update(last_turn_fields(spec.data))  # type: ignore[arg-type]
    committed = store.step_commit(step)
    for call in (*step.new_tool_calls, *step.updated_tool_calls):
        # Every call's end is counted once, by the commit that records it: the calls that
        # ran and those refused before running (an approver, a deadline, credits, a limit).
        if call.status != ToolCallStatus.EXECUTING:
            metrics.TOOL_CALLS.labels(call.tool_name, call.status).inc()
    parent = step.session.parent_id
    if parent is not None and committed.state in TURN_ENDED:
        # A child's end: its parent's waiting call has its answer now.
        run_enqueue_on_commit(parent, step.session.value)
    return committed


def build_step(
    session: Session,
    owner: str | None,
    *,
    trigger: Trigger | None,
    phase: str,
    env: dict[str, Any] | None = None,
    reason: str = "",
    actor: str = "",
    messages: list[Message] | None = None,
    activate_message: Message | None = None,
    new_tool_calls: list[ToolCall] | None = None,
    updated_tool_calls: list[ToolCall] | None = None,
    model_calls: list[ModelCall] | None = None,
    events: list[EventSpec] | None = None,
    after_events: list[EventSpec] | None = None,
    checkpoint: dict[str, Any] | None = None,
    set_fields: dict[str, Any] | None = None,
    add_fields: dict[str, Any] | None = None,
    unless_cancel_requested: bool = False,
    archive_through: int | None = None,
    message_slots: list[int] | None = None,
) -> Step:
    """A Step with the lease guard, lease renewal and a delta checkpoint.

    The checkpoint holds only what this step changed (turn, iteration, phase,
    the calls it opened or closed, the model it used) and the environment
    when it differs from the previous step's.
    """
    set_fields = {} if set_fields is None else set_fields
    context: dict[str, Any] = {
        "turn": set_fields.get("turn", session.turn),
        "iteration": set_fields.get("iteration", session.iteration),
        "phase": phase,
        **(checkpoint or {}),
    }
    fingerprint = ""
    if env is not None:
        fingerprint = env_fingerprint(env)
        if fingerprint != session.env_fingerprint:
            context["env"] = env
            set_fields.setdefault("env_fingerprint", fingerprint)
    return Step(
        session=session,
        trigger=trigger,
        reason=reason,
        actor=actor,
        messages=messages or [],
        activate_message=activate_message,
        new_tool_calls=new_tool_calls or [],
        updated_tool_calls=updated_tool_calls or [],
        model_calls=model_calls or [],
        events=events or [],
        after_events=after_events or [],
        checkpoint=context,
        set_fields=set_fields,
        add_fields=add_fields or {},
        lease_owner=owner,
        lease_seconds=settings.SESSION_LEASE_S if owner else settings.SESSION_PICKUP_GRACE_S,
        fingerprint=fingerprint or session.env_fingerprint,
        unless_cancel_requested=unless_cancel_requested,
        archive_through=archive_through,
        message_slots=message_slots,
    )


# --- A turn starts ------------------------------------------------------------


def turn_start(
    *, session: Session, lease_owner: str | None, message: Message | None = None
) -> bool:
    """Start the next turn: with the oldest queued user message, or with
    `message`, a new one that was never queued (it is inserted by this step)."""
    fresh = message is not None
    if message is None:
        message = (
            Message.objects.filter(session=session, status=MessageStatus.QUEUED)
            .order_by("id")
            .first()
        )
    if message is None:
        return False
    turn = session.turn + 1
    if fresh:
        message.turn = turn
    trace: dict[str, Any] = {}
    if tracing.enabled() or session.trace_parent:
        trace["trace_parent"] = tracing.turn_begin(
            session_id=str(session.pk),
            agent=session.agent.slug if session.agent_id else "",
            turn=turn,
        )
    metered_commit(
        build_step(
            session,
            lease_owner,
            trigger=Trigger.USER_MESSAGE,
            phase="turn_start",
            reason=f"turn {turn}",
            activate_message=None if fresh else message,
            messages=[message] if fresh else [],
            set_fields={
                "turn": turn,
                "iteration": 0,
                "cancel_requested": False,
                "cancel_reason": "",
                "cancel_actor": "",
                "last_error": "",
                "turn_started_at": timezone.now(),
                **trace,
            },
            add_fields={} if fresh else {"queued_count": -1},
            checkpoint={"message_seq": session.message_seq + 1},
        )
    )
    return True


# --- The model decided ----------------------------------------------------------


@dataclass(frozen=True)
class ModelContext:
    """What a model step's commit records besides the model's outcome."""

    env: dict[str, Any]
    model: str | None  # the endpoint that answered, if one did
    deadline: float | None  # the turn's time limit, as a timestamp
    notes: list[Message]  # platform notes the model saw (environment changes, a summary)
    degradation: int | None = None  # the level this step ran at (billing/degradation.py)
    # The session's dialogue state after this step's user messages; None: unchanged.
    dialogue_state: dict[str, Any] | None = None
    # Tokens per partition of the request (engine/model/context.py), for the admin.
    tokens: dict[str, int] | None = None
    # A new summary among the notes replaced the history up to this seq.
    archive_through: int | None = None
    # What the model saw of its situation (engine/model/environment.py `Seen`): the
    # reference of the drift check after a pause.
    seen: dict[str, Any] | None = None

    def checkpoint(self) -> dict[str, Any]:
        recorded: dict[str, Any] = {"model": self.model, "deadline": self.deadline}
        if self.tokens is not None:
            recorded["context"] = self.tokens
        if self.seen is not None:
            recorded["seen"] = self.seen
        return recorded

    def dialogue_fields(self) -> dict[str, Any]:
        return {} if self.dialogue_state is None else {"dialogue_state": self.dialogue_state}

    def degradation_change(self, session: Session) -> tuple[dict[str, Any], list[EventSpec]]:
        """The session's new degradation level and its `progress` event, if it changed."""
        if self.degradation is None or self.degradation == session.degradation_level:
            return {}, []
        data: Progress = {"stage": "degradation", "turn": session.turn, "level": self.degradation}
        return {"degradation_level": self.degradation}, [EventSpec(EventType.PROGRESS, data)]


def tool_intents(
    session: Session,
    owner: str,
    *,
    text: str,
    tool_calls: list[ToolCallRequest],
    spend: ModelSpend,
    context: ModelContext,
    client_tools: frozenset[str] = frozenset(),
) -> None:
    """Commit the model's tool calls as intents (-> tool_wait), before any of them runs.
    A call to one of `client_tools` is marked the client's: it never runs here."""
    step_no = session.step + 1
    calls = [
        ToolCall(
            turn=session.turn,
            step=step_no,
            position=position,
            # Column limits: a model may send anything; the tool layer rejects the
            # odd name with a clear result rather than the step crashing on it.
            call_id=call.id[:100],
            tool_name=call.name[:100],
            input=call.arguments,
            error=call.arguments_error or "",
            # Stable per logical call: a re-run of this step reuses the stored row and key.
            idempotency_key=f"{session.pk}:{session.turn}:{step_no}:{position}:{call.name[:100]}",
            client=call.name in client_tools,
        )
        for position, call in enumerate(tool_calls)
    ]
    requested = tool_calls_json(tool_calls)
    message = Message(
        turn=session.turn,
        role="assistant",
        content=text,
        tool_calls=requested,
        token_count=count_message_tokens(text, canonical_json(requested)),
    )
    started: list[EventSpec] = [
        EventSpec(
            EventType.TOOL_STARTED,
            ToolStarted(call_id=c.call_id, tool=c.tool_name, input=c.input, turn=c.turn),
        )
        for c in calls
    ]
    level_fields, level_events = context.degradation_change(session)
    step = build_step(
        session,
        owner,
        trigger=Trigger.TOOL_CALLS,
        phase="tool_intent",
        reason=", ".join(c.tool_name for c in calls),
        messages=[*context.notes, message],
        new_tool_calls=calls,
        events=level_events,
        after_events=started,
        env=context.env,
        checkpoint={
            **context.checkpoint(),
            "pending": [[c.call_id, c.idempotency_key] for c in calls],
        },
        add_fields=spend.usage.add_fields(),
        model_calls=spend.calls,
        set_fields={**spend.set_fields(), **level_fields, **context.dialogue_fields()},
        archive_through=context.archive_through,
    )
    # The tool step that follows reads these calls first: this commit reads them
    # back in its own round trip, so that step sends none.
    step.then_read = open_calls_statement(session, session.turn)
    committed = metered_commit(step)
    prefetched_keep(session, committed.version, session.turn, committed.read or [])


def answer(
    session: Session,
    owner: str,
    *,
    content: str,
    trigger: Trigger,
    stop_reason: StopReason | str,
    spend: ModelSpend,
    context: ModelContext,
    last_error: str = "",
    reason: str = "",
    calls: CallCounts | None = None,
) -> None:
    """End the turn with the model's answer (or the busy message), unless a cancel came first.

    `calls`: the turn's tool calls by how they ended, as the run holds them (None: read).
    An interrupt that arrived while the model answered wins: the turn ends
    cancelled (the call's usage is kept); any other conflict goes to the run loop.
    """
    message = Message(
        turn=session.turn,
        role="assistant",
        content=content,
        token_count=count_message_tokens(content),
    )
    usage = spend.usage
    summary = turn_summary(
        session,
        stop_reason,
        usage,
        iterations=spend.iteration,
        calls=calls if calls is not None else turn_calls_counted(session),
    )
    level_fields, level_events = context.degradation_change(session)
    try:
        metered_commit(
            build_step(
                session,
                owner,
                trigger=trigger,
                phase="answer",
                reason=reason or stop_reason,
                messages=[*context.notes, message],
                events=level_events,
                after_events=[EventSpec(EventType.TURN_FINISHED, summary)],
                env=context.env,
                checkpoint=context.checkpoint(),
                add_fields=usage.add_fields(),
                model_calls=spend.calls,
                set_fields={
                    **spend.set_fields(),
                    "last_error": last_error[:2000],
                    **level_fields,
                    **context.dialogue_fields(),
                },
                unless_cancel_requested=True,
                archive_through=context.archive_through,
            )
        )
    except StaleSession:
        fresh = Session.objects.filter(
            pk=session.pk, lease_owner=owner, cancel_requested=True
        ).first()
        if fresh is None or State(fresh.state) not in RUNNABLE:
            raise
        turn_cancel(session=fresh, owner=owner, spend=spend)


# --- Tools ran ------------------------------------------------------------------


def call_result(
    session: Session, call: ToolCall, outcome: ToolOutcome, finished_at: Any
) -> tuple[Message, EventSpec]:
    """Put a call's outcome on the call, and make its tool message and `tool.finished` event:
    what the commit that records a result writes (the results' commit of a tool step, or a
    workflow node step that ran its read-only call itself)."""
    # Results the executor did not make (memory tools, probes, a person's review) are
    # held to the same size limit as those it did; a failure from the executor comes
    # scrubbed (tools.execution._failure).
    outcome = outcome_within_limit(outcome)
    call.status = outcome.status
    call.output = outcome.output
    call.error = outcome.error
    if call.tool_name.startswith(WORKFLOW_REVIEW_PREFIX) and call.created_at is not None:
        # A review's work is the person's: from the card's opening to its decision's result.
        outcome.elapsed_ms = max(0, int((finished_at - call.created_at).total_seconds() * 1000))
    call.elapsed_ms = outcome.elapsed_ms
    call.finished_at = finished_at
    call.coercions = outcome.coercions
    call.attempts = max(call.attempts, 0) + outcome.attempts
    call.cached = bool(outcome.extra.get("cached"))
    call.refusal = str(outcome.extra.get("refusal", ""))
    message = Message(
        turn=session.turn,
        role="tool",
        content=outcome.content,
        tool_call_id=call.call_id,
        name=call.tool_name,
        data=outcome.output
        if outcome.output is not None
        else {"error": outcome.error, "status": outcome.status},
        token_count=count_message_tokens(outcome.content),
    )
    finished = ToolFinished(
        call_id=call.call_id,
        tool=call.tool_name,
        status=outcome.status,
        elapsed_ms=outcome.elapsed_ms,
        output=outcome.output,
        error=outcome.error,
        cached=call.cached,
        coercions=call.coercions,
        probed=call.probe_outcome or None,
        turn=call.turn,
    )
    if getattr(call, "proposed_input", None) is not None:
        # Ran with an approver's edit: what ran, and what the model had proposed.
        finished["input"], finished["proposed_input"] = call.input, call.proposed_input
    if call.refusal:
        finished["refusal"] = call.refusal
    return message, EventSpec(EventType.TOOL_FINISHED, finished)


def tool_results(
    session: Session,
    owner: str,
    *,
    calls: list[ToolCall],
    outcomes: dict[int, ToolOutcome],
    tools: dict[str, ToolSnapshot],
    env: dict[str, Any],
    extra_events: list[EventSpec] | None = None,
    stop: StopReason | None = None,
    stop_note: str = "",
    ask: "Question | None" = None,
    usage: Usage | None = None,
    handoff: "HandoffTo | None" = None,
    client: "ClientWait | None" = None,
    revalidated: bool = False,
) -> None:
    """Commit the calls' results, their tool messages and events, and move on to
    the model (-> tool_loop -> processing, both moves in this one commit); a
    scheduled follow-up moves the session to `waiting_timer` instead, and
    `stop` ends the turn there (-> tool_loop -> finished) with `stop_note` as
    the agent's partial answer. An open question (`ask_user`) moves it to
    `paused_for_user` instead, as do calls of the client's own tools (`client`), left
    open for the client's results.

    A cancel requested while the tools ran stops at `tool_loop` (the results
    are kept), where the run loop carries the cancel out. Calls an operator ran by
    hand end the turn again (-> tool_loop -> finished, stop reason `operator`): the
    model decides only once they hand the session back.

    `revalidated`: the step ran the business prechecks of a recovery
    (engine/gates/revalidation.py): `resume_check` is spent, so the next model step does
    not check again the calls just sent (their check would now find them done).
    """
    finished_at = timezone.now()
    messages: list[Message] = []
    events: list[EventSpec] = []
    timer: tuple[int, str] | None = None
    for call in calls:
        message, event = call_result(session, call, outcomes[call.pk], finished_at)
        messages.append(message)
        events.append(event)
        snapshot = tools.get(call.tool_name)
        if (
            snapshot is not None
            and snapshot.handler == TIMER_HANDLER
            and call.status == ToolCallStatus.SUCCESS
            and call.output
        ):
            timer = (int(call.output.get("after_seconds", 0)), str(call.output.get("note", "")))
    trigger, set_fields = _results_move(session, timer, ask, client, handoff, events)
    if revalidated:
        set_fields["resume_check"] = False
    fold = trigger in (Trigger.TOOL_RESULTS, Trigger.HANDOFF) and not session.cancel_requested
    events += extra_events or []
    by_hand = bool(calls) and all(operator_call(c) for c in calls)
    # What the turn's end adds (the agent's partial answer), only if this commit ends it.
    closing, finish = (
        _results_turn_end(session, calls, stop, stop_note, by_hand=by_hand) if fold else ([], [])
    )
    checkpoint = {
        "done": [[c.call_id, c.status, c.attempts] for c in calls],
        **({"timer_due": set_fields["timer_due_at"].isoformat()} if timer and not ask else {}),
        **({"question": ask.call.call_id} if ask is not None else {}),
        **({"client_calls": [c.call_id for c in client.calls]} if client else {}),
    }

    def commit(fold: bool) -> None:
        step = build_step(
            session,
            owner,
            trigger=trigger,
            phase="tool_results",
            reason=", ".join(f"{c.tool_name}={c.status}" for c in calls),
            messages=messages + closing if fold else messages,
            updated_tool_calls=calls,
            events=events,
            after_events=finish if fold else [],
            env=env,
            set_fields=dict(set_fields),
            add_fields=usage.add_fields() if usage is not None and usage != NO_USAGE else None,
            checkpoint=checkpoint,
            unless_cancel_requested=fold,
        )
        then = Trigger.OPERATOR_DONE if by_hand else Trigger.LIMIT_REACHED
        step.then = (then if finish else Trigger.MODEL_CALL) if fold else None
        metered_commit(step)
        # A workflow's node step reads these calls next (engine/phases/node.py).
        finished_keep(session, calls)

    try:
        commit(fold)
    except StaleSession:
        if not fold or not _cancel_came(session, owner):
            raise
        # Refused for a cancel that came while the tools ran: keep the results and stop
        # at tool_loop; anything else goes to the run loop.
        commit(False)


def _results_move(
    session: Session,
    timer: tuple[int, str] | None,
    ask: "Question | None",
    client: "ClientWait | None",
    handoff: "HandoffTo | None",
    events: list[EventSpec],
) -> tuple[Trigger, dict[str, Any]]:
    """Where the results take the session (the model, a timer, the user's or the client's
    answer, another agent) and the fields that go with it; adds the events it calls for."""
    set_fields: dict[str, Any] = {}
    trigger = Trigger.TOOL_RESULTS
    if timer is not None:
        # No worker waits on a clock: the due time lives in the row; the sweeper wakes it.
        trigger = Trigger.TIMER_SET
        set_fields = {
            "timer_due_at": timezone.now() + timedelta(seconds=timer[0]),
            "timer_note": timer[1],
        }
    if ask is not None:
        trigger, set_fields = Trigger.ASK_USER, {"timer_due_at": ask.due_at, "timer_note": ""}
        events.append(ask.event(session.turn))
    if client is not None:
        # The client runs them: the turn waits for its results, as for the user's answer.
        trigger, set_fields = Trigger.ASK_USER, {"timer_due_at": client.due_at, "timer_note": ""}
        events.append(client.event(session.turn))
    if handoff is not None and trigger == Trigger.TOOL_RESULTS:
        # Another agent decides from the next step on, with the history as it is.
        trigger = Trigger.HANDOFF
        set_fields["agent_id"] = handoff.agent.pk
        changed: AgentChanged = {
            "from": session.agent.slug,
            "to": handoff.agent.slug,
            "reason": handoff.reason,
        }
        events.append(EventSpec(EventType.AGENT_CHANGED, changed))
    return trigger, set_fields


def _results_turn_end(
    session: Session,
    calls: list[ToolCall],
    stop: StopReason | None,
    stop_note: str,
    *,
    by_hand: bool,
) -> tuple[list[Message], list[EventSpec]]:
    """The turn's end the results bring, when they bring one: calls an operator ran by hand,
    or a stop (with `stop_note` as the agent's partial answer)."""
    if by_hand:
        summary = turn_summary(
            session, StopReason.OPERATOR, calls=turn_calls_counted(session, calls)
        )
        return [], [EventSpec(EventType.TURN_FINISHED, summary)]
    if stop is None:
        return [], []
    closing = Message(
        turn=session.turn,
        role="assistant",
        content=stop_note,
        token_count=count_message_tokens(stop_note),
    )
    # A rare end (the credits refused twice): the turn's earlier calls are read.
    summary = turn_summary(session, stop, calls=turn_calls_counted(session, calls))
    return [closing], [EventSpec(EventType.TURN_FINISHED, summary)]


def _cancel_came(session: Session, owner: str) -> bool:
    """A cancel was requested meanwhile (still our lease and version): the session's copy
    takes it."""
    fresh = (
        Session.objects.filter(
            pk=session.pk, version=session.version, lease_owner=owner, cancel_requested=True
        )
        .values_list("cancel_reason", "cancel_actor")
        .first()
    )
    if fresh is None:
        return False
    session.cancel_requested = True
    session.cancel_reason, session.cancel_actor = fresh
    return True


def tool_loop_next(session: Session, owner: str) -> None:
    """Results are back: the model decides again (-> processing)."""
    metered_commit(build_step(session, owner, trigger=Trigger.MODEL_CALL, phase="model"))


def timer_fire(*, session: Session) -> None:
    """Wake a session whose follow-up is due: the model gets the note and decides.

    The turn's clock starts again: waiting for the timer was not running, so
    a follow-up due after the turn's time limit still gets a turn to act in.
    """
    note = session.timer_note or "(no note)"
    text = f"The follow-up you scheduled is due now. Your note: {note}"
    metered_commit(
        build_step(
            session,
            None,
            trigger=Trigger.TIMER_FIRED,
            phase="timer",
            reason="follow-up due",
            messages=[
                Message(
                    turn=session.turn,
                    role="system",
                    content=text,
                    token_count=count_message_tokens(text),
                )
            ],
            set_fields={"timer_due_at": None, "timer_note": "", "turn_started_at": timezone.now()},
        )
    )


# --- A turn ends ----------------------------------------------------------------


def turn_summary(
    session: Session,
    stop_reason: StopReason | str,
    usage: Usage | None = None,
    iterations: int | None = None,
    *,
    calls: CallCounts,
) -> TurnFinished:
    """The turn's `turn.finished`: why and how it ended (`calls`: its tool calls by how
    they ended, this step's included), its model calls and usage."""
    summary: TurnFinished = {
        "turn": session.turn,
        "stop_reason": stop_reason,
        # Model calls in this turn, counting the one this step commits.
        "iterations": session.iteration if iterations is None else iterations,
        "usage": (usage or NO_USAGE).totals(session),
        "outcome": turn_outcome(stop_reason, calls).value,
        "calls": calls,
    }
    if session.trace_parent:
        summary["trace_id"] = tracing.trace_id_of(session.trace_parent)
    return summary


NO_USAGE = Usage()


def last_turn_fields(summary: TurnFinished) -> dict[str, Any]:
    """The session's record of its last ended turn, from that turn's `turn.finished`."""
    return {
        "last_turn_number": summary["turn"],
        "last_turn_outcome": summary["outcome"],
        "last_turn_calls": dict(summary["calls"]),
    }


def turn_finish(
    session: Session,
    owner: str | None,
    trigger: Trigger,
    reason: str,
    *,
    stop_reason: StopReason,
    error: str = "",
    actor: str = "",
    spend: ModelSpend | None = None,
    answer: Message | None = None,
    refusal: str = "",
    closed_error: str = "",
) -> None:
    """End the turn (cancelled, error, ...) with its events, in one step; `answer`
    (an operator's) comes after the closed calls' results. `refusal` and `closed_error`:
    why the calls that never started did not run, when the turn's end says more than
    "the turn ended" (the client's calls past their deadline: expired).

    Calls of the turn that never started are closed as rejected, so no
    ToolCall is left `executing` once its turn is over. Each closed call also
    gets its tool result message saying so: the history stays well formed (a
    model API refuses tool calls without results) and a resumed run, or the
    next turn, tells the model what became of the call.
    """
    usage = spend.usage if spend is not None else NO_USAGE
    events: list[EventSpec] = []
    if error:
        code = "model_error" if trigger == Trigger.FAILURE else stop_reason
        events.append(EventSpec(EventType.ERROR, {"code": code, "message": scrub(error)[:500]}))
    # One read: the turn's calls, the open ones to close and all of them to count (an
    # open call has no output yet: the column is left unread).
    turn_calls = list(
        ToolCall.objects.filter(session=session, turn=session.turn)
        .defer("output")
        .order_by("step", "position")
    )
    open_calls = [c for c in turn_calls if c.status == ToolCallStatus.EXECUTING]
    now = timezone.now()
    for call in open_calls:
        call.status = (
            ToolCallStatus.REJECTED if call.dispatched_at is None else ToolCallStatus.FAILED
        )
        if call.dispatched_at is None:
            call.refusal = refusal
        call.error = (
            (closed_error or f"the turn ended ({stop_reason}) before this call ran")
            if call.dispatched_at is None
            else f"the turn ended ({stop_reason}) while this call was in flight; its outcome is unknown "
            f"(idempotency key {call.idempotency_key})"
        )
        call.finished_at = now
        call.output = None  # never read (deferred), still none: the results' columns write it
    results = [_closed_call_result(session, call) for call in open_calls]
    summary = turn_summary(
        session,
        stop_reason,
        usage,
        iterations=spend.iteration if spend is not None else None,
        calls=call_counts((c.status, c.refusal) for c in turn_calls),
    )
    closed: list[EventSpec] = []
    for c in open_calls:
        finished = ToolFinished(
            call_id=c.call_id, tool=c.tool_name, status=c.status, error=c.error, turn=c.turn
        )
        if c.refusal:
            finished["refusal"] = c.refusal
        closed.append(EventSpec(EventType.TOOL_FINISHED, finished))
    events[:0] = closed
    metered_commit(
        build_step(
            session,
            owner,
            trigger=trigger,
            phase=stop_reason,
            reason=reason,
            actor=actor,
            messages=results + ([answer] if answer is not None else []),
            events=events,
            updated_tool_calls=open_calls,
            after_events=[EventSpec(EventType.TURN_FINISHED, {**summary, "reason": reason})],
            set_fields={
                **(spend.set_fields() if spend is not None else {}),
                "cancel_requested": False,
                "cancel_reason": "",
                "cancel_actor": "",
                "timer_due_at": None,
                "timer_note": "",
                "last_error": error[:2000],
            },
            add_fields=usage.add_fields() if spend is not None else {},
            model_calls=spend.calls if spend is not None else [],
        )
    )


def _closed_call_result(session: Session, call: ToolCall) -> Message:
    content = render_failure(call.status, call.error)
    return Message(
        turn=session.turn,
        role="tool",
        content=content,
        tool_call_id=call.call_id,
        name=call.tool_name,
        data={"error": call.error, "status": call.status},
        token_count=count_message_tokens(content),
    )


def turn_fail(session: Session, owner: str, problem: str, *, reason: str | None = None) -> None:
    """End the turn in `error` for an operator to look at (and maybe resume)."""
    turn_finish(
        session,
        owner,
        Trigger.FAILURE,
        problem if reason is None else reason,
        stop_reason=StopReason.ERROR,
        error=problem,
    )


def turn_cancel(
    *,
    session: Session,
    owner: str | None = None,
    reason: str | None = None,
    actor: str | None = None,
    spend: ModelSpend | None = None,
) -> None:
    """The one way a turn ends cancelled.

    Without `reason` and `actor`, the cancel recorded on the row (a client's
    cancel, or an interrupt by a new message) is the one carried out: by the
    worker at a step boundary or when the model's stream was closed (`spend`:
    what the model call used up to then). With them, a turn no worker runs
    (waiting on a person or a clock) is cancelled by the service itself.
    """
    if reason is None:
        reason = session.cancel_reason or "cancel requested"
    if actor is None:
        actor = session.cancel_actor
    stop = StopReason.INTERRUPTED if reason == INTERRUPT_REASON else StopReason.CANCELLED
    turn_finish(session, owner, Trigger.CANCEL, reason, stop_reason=stop, actor=actor, spend=spend)


# --- An operator steps in ---------------------------------------------------------


def run_resume(*, session: Session, actor: str = "") -> None:
    """Continue a run that stopped in `error`, from where it stopped (-> tool_loop)."""
    metered_commit(
        build_step(
            session,
            None,
            trigger=Trigger.RESUME,
            phase="resume",
            reason="resumed",
            actor=actor,
            set_fields={
                "resume_check": True,
                "last_error": "",
                "iteration": 0,
                "turn_started_at": timezone.now(),
            },
        )
    )


def fork_start(
    *,
    fork: Session,
    source: Session,
    at_step: int,
    message_seq: int,
    env: dict[str, Any] | None,
    decide: bool,
    actor: str = "",
) -> None:
    """The first step of a forked session, whose history is already copied: the
    model decides next (-> tool_loop) when `decide`, else it waits for the user.

    `env` is the environment recorded at the fork point: the next model step
    compares it with today's and tells the model what changed.
    """
    metered_commit(
        build_step(
            fork,
            None,
            trigger=Trigger.FORK if decide else None,
            phase="fork",
            reason=f"forked from {source.pk} at checkpoint {at_step}",
            actor=actor,
            set_fields={"turn_started_at": timezone.now(), "iteration": 0},
            checkpoint={
                "forked_from": str(source.pk),
                "at_step": at_step,
                "message_seq": message_seq,
                **({"env": env} if env is not None else {}),
            },
        )
    )
