"""The session state machine: states, triggers and the one table of allowed moves.

Pure Python on purpose: the engine, the services and the tests all read the
same table, and nothing here touches the database.
"""

from enum import StrEnum


class State(StrEnum):
    IDLE = "idle"
    PROCESSING = "processing"
    TOOL_WAIT = "tool_wait"
    TOOL_LOOP = "tool_loop"
    PAUSED_FOR_USER = "paused_for_user"
    AWAITING_APPROVAL = "awaiting_approval"
    WAITING_TIMER = "waiting_timer"
    ERROR = "error"
    FINISHED = "finished"
    CANCELLED = "cancelled"


class Trigger(StrEnum):
    USER_MESSAGE = "user_message"
    TOOL_CALLS = "tool_calls"
    ANSWER = "answer"
    TOOL_RESULTS = "tool_results"
    MODEL_CALL = "model_call"
    ASK_USER = "ask_user"
    USER_ANSWER = "user_answer"
    APPROVAL_NEEDED = "approval_needed"
    APPROVED = "approved"
    REJECTED = "rejected"
    TIMER_SET = "timer_set"
    TIMER_FIRED = "timer_fired"
    LIMIT_REACHED = "limit_reached"
    FAILURE = "failure"
    CANCEL = "cancel"
    RESUME = "resume"
    OPERATOR_ANSWER = "operator_answer"
    HAND_BACK = "hand_back"
    OPERATOR_TOOL = "operator_tool"
    OPERATOR_DONE = "operator_done"
    FORK = "fork"
    HANDOFF = "handoff"


S, T = State, Trigger

# (from, trigger) -> to. Anything not listed is illegal.
TRANSITIONS: dict[tuple[State, Trigger], State] = {
    # A new turn starts from any state that ended the previous one.
    (S.IDLE, T.USER_MESSAGE): S.PROCESSING,
    (S.FINISHED, T.USER_MESSAGE): S.PROCESSING,
    (S.CANCELLED, T.USER_MESSAGE): S.PROCESSING,
    (S.ERROR, T.USER_MESSAGE): S.PROCESSING,
    (S.PAUSED_FOR_USER, T.USER_MESSAGE): S.PROCESSING,
    # The model decided.
    (S.PROCESSING, T.TOOL_CALLS): S.TOOL_WAIT,
    (S.PROCESSING, T.ANSWER): S.FINISHED,
    (S.PROCESSING, T.ASK_USER): S.PAUSED_FOR_USER,
    (S.PROCESSING, T.LIMIT_REACHED): S.FINISHED,
    (S.PROCESSING, T.FAILURE): S.ERROR,
    (S.PROCESSING, T.CANCEL): S.CANCELLED,
    # Tools ran (or wait on a human or a clock).
    (S.TOOL_WAIT, T.TOOL_RESULTS): S.TOOL_LOOP,
    # A transfer_to_<slug> call: the results are back and another agent decides from now on.
    (S.TOOL_WAIT, T.HANDOFF): S.TOOL_LOOP,
    (S.TOOL_WAIT, T.APPROVAL_NEEDED): S.AWAITING_APPROVAL,
    # The model's `ask_user` call stays open until the user answers it.
    (S.TOOL_WAIT, T.ASK_USER): S.PAUSED_FOR_USER,
    (S.TOOL_WAIT, T.TIMER_SET): S.WAITING_TIMER,
    (S.TOOL_WAIT, T.FAILURE): S.ERROR,
    (S.TOOL_WAIT, T.CANCEL): S.CANCELLED,
    # Results are back; the model must decide again, or a limit ends the turn.
    (S.TOOL_LOOP, T.MODEL_CALL): S.PROCESSING,
    (S.TOOL_LOOP, T.LIMIT_REACHED): S.FINISHED,
    (S.TOOL_LOOP, T.FAILURE): S.ERROR,
    (S.TOOL_LOOP, T.CANCEL): S.CANCELLED,
    # Waiting on people and clocks; no worker is held meanwhile.
    (S.AWAITING_APPROVAL, T.APPROVED): S.TOOL_WAIT,
    # Either way the tool phase writes every result in the model's order.
    (S.AWAITING_APPROVAL, T.REJECTED): S.TOOL_WAIT,
    (S.AWAITING_APPROVAL, T.CANCEL): S.CANCELLED,
    (S.WAITING_TIMER, T.TIMER_FIRED): S.TOOL_LOOP,
    (S.WAITING_TIMER, T.CANCEL): S.CANCELLED,
    (S.PAUSED_FOR_USER, T.CANCEL): S.CANCELLED,
    # The user's next message answers the open question; the same turn goes on.
    (S.PAUSED_FOR_USER, T.USER_ANSWER): S.TOOL_LOOP,
    # The client answered its tool calls by handing over to another agent (an Agents SDK
    # handoff between two platform agents): that agent decides from the next step on.
    (S.PAUSED_FOR_USER, T.HANDOFF): S.TOOL_LOOP,
    # An operator resumes a failed run where it stopped.
    (S.ERROR, T.RESUME): S.TOOL_LOOP,
    # An operator ends a waiting (or failed) turn with their own answer.
    (S.AWAITING_APPROVAL, T.OPERATOR_ANSWER): S.FINISHED,
    (S.PAUSED_FOR_USER, T.OPERATOR_ANSWER): S.FINISHED,
    (S.WAITING_TIMER, T.OPERATOR_ANSWER): S.FINISHED,
    (S.ERROR, T.OPERATOR_ANSWER): S.FINISHED,
    # After a takeover the agent goes on from the history as it now stands.
    (S.IDLE, T.HAND_BACK): S.TOOL_LOOP,
    (S.FINISHED, T.HAND_BACK): S.TOOL_LOOP,
    (S.CANCELLED, T.HAND_BACK): S.TOOL_LOOP,
    # An operator runs a tool by hand between turns: the tool phase runs it like a model's
    # call (gates, approval, credits, probes), then the turn ends again without the model.
    (S.IDLE, T.OPERATOR_TOOL): S.TOOL_WAIT,
    (S.FINISHED, T.OPERATOR_TOOL): S.TOOL_WAIT,
    (S.CANCELLED, T.OPERATOR_TOOL): S.TOOL_WAIT,
    (S.ERROR, T.OPERATOR_TOOL): S.TOOL_WAIT,
    (S.TOOL_LOOP, T.OPERATOR_DONE): S.FINISHED,
    # A session forked from a checkpoint starts with the model deciding.
    (S.IDLE, T.FORK): S.TOOL_LOOP,
}

# States in which a worker has something to do right now.
RUNNABLE: frozenset[State] = frozenset({S.PROCESSING, S.TOOL_WAIT, S.TOOL_LOOP})
# States that end a turn; the next user message starts a new one.
TURN_ENDED: frozenset[State] = frozenset({S.IDLE, S.FINISHED, S.CANCELLED, S.ERROR})
# States in which a new user message starts a turn right away.
STARTS_TURN: frozenset[State] = TURN_ENDED | {S.PAUSED_FOR_USER}


class IllegalTransition(Exception):
    """A move that the table does not allow; nothing was changed."""

    def __init__(self, current: State | str, trigger: Trigger | str) -> None:
        self.current = str(current)
        self.trigger = str(trigger)
        allowed = sorted(t.value for (s, t) in TRANSITIONS if s.value == self.current)
        super().__init__(
            f"'{self.trigger}' is not allowed in state '{self.current}' (allowed: {', '.join(allowed) or 'none'})"
        )


def next_state(current: State | str, trigger: Trigger | str) -> State:
    """Return the state a trigger leads to, or raise IllegalTransition."""
    try:
        return TRANSITIONS[(State(current), Trigger(trigger))]
    except (KeyError, ValueError):
        raise IllegalTransition(current, trigger) from None
