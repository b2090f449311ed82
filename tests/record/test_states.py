"""The state table, pair by pair: every allowed move lands where the table says, every other one is refused."""

import itertools

import pytest

from record.states import (
    RUNNABLE,
    TRANSITIONS,
    TURN_ENDED,
    IllegalTransition,
    State,
    Trigger,
    next_state,
)

ALL_PAIRS = list(itertools.product(State, Trigger))
ALLOWED = sorted(TRANSITIONS.items())
ILLEGAL = [pair for pair in ALL_PAIRS if pair not in TRANSITIONS]


def test_the_table_only_names_known_states_and_triggers():
    for (state, trigger), target in TRANSITIONS.items():
        assert (
            isinstance(state, State) and isinstance(trigger, Trigger) and isinstance(target, State)
        )
    # The pairs split cleanly into allowed and illegal.
    assert len(ALLOWED) + len(ILLEGAL) == len(State) * len(Trigger)
    assert len(ALLOWED) == 44  # and the handoffs (tool_wait or a client's paused turn -> tool_loop)


@pytest.mark.parametrize(("pair", "target"), ALLOWED, ids=[f"{s}-{t}" for (s, t), _ in ALLOWED])
def test_allowed_pair_moves_to_the_tables_target(pair, target):
    state, trigger = pair
    assert next_state(state, trigger) is target
    # Plain strings (as stored in the database) work the same.
    assert next_state(state.value, trigger.value) is target


@pytest.mark.parametrize("pair", ILLEGAL, ids=[f"{s}-{t}" for s, t in ILLEGAL])
def test_every_other_pair_is_illegal(pair):
    state, trigger = pair
    with pytest.raises(IllegalTransition) as info:
        next_state(state, trigger)
    assert info.value.current == state.value
    assert info.value.trigger == trigger.value
    allowed_here = sorted(t.value for (s, t) in TRANSITIONS if s == state)
    message = str(info.value)
    assert f"'{trigger.value}' is not allowed in state '{state.value}'" in message
    assert f"(allowed: {', '.join(allowed_here) or 'none'})" in message


@pytest.mark.parametrize(
    ("state", "trigger"),
    [("bogus", "user_message"), ("idle", "bogus"), ("", ""), (None, "cancel")],
)
def test_unknown_names_are_illegal_not_a_crash(state, trigger):
    with pytest.raises(IllegalTransition):
        next_state(state, trigger)


def test_every_state_that_ends_a_turn_accepts_a_user_message():
    for state in TURN_ENDED:
        assert next_state(state, Trigger.USER_MESSAGE) is State.PROCESSING


def test_every_runnable_state_can_be_cancelled_and_can_fail():
    for state in RUNNABLE:
        assert next_state(state, Trigger.CANCEL) is State.CANCELLED
        assert next_state(state, Trigger.FAILURE) is State.ERROR


def test_terminal_states_only_leave_through_a_new_turn_or_an_operators_takeover():
    for state in (State.FINISHED, State.CANCELLED):
        leaving = {t for (s, t) in TRANSITIONS if s == state}
        assert leaving == {Trigger.USER_MESSAGE, Trigger.HAND_BACK, Trigger.OPERATOR_TOOL}


def test_a_tool_run_by_hand_goes_through_the_tool_phase_and_ends_the_turn_again():
    for state in (State.IDLE, State.FINISHED, State.CANCELLED, State.ERROR):
        assert next_state(state, Trigger.OPERATOR_TOOL) is State.TOOL_WAIT
    assert next_state(State.TOOL_LOOP, Trigger.OPERATOR_DONE) is State.FINISHED
    for state in (State.PROCESSING, State.AWAITING_APPROVAL, State.PAUSED_FOR_USER):
        assert (state, Trigger.OPERATOR_TOOL) not in TRANSITIONS


def test_every_state_is_reachable_from_idle():
    reached = {State.IDLE}
    frontier = [State.IDLE]
    while frontier:
        current = frontier.pop()
        for (s, _), target in TRANSITIONS.items():
            if s == current and target not in reached:
                reached.add(target)
                frontier.append(target)
    assert reached == set(State)
