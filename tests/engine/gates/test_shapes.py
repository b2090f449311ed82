"""The gates' one shape on a model step: the verdicts' contributions add up in order; a
verdict stops the turn or not."""

from typing import Any

from billing.budgets import BudgetVerdict
from billing.selectors import CreditsCheck
from engine.gates import Contribution, Stop, Verdict
from engine.gates.budget import BUDGET_NOTE, ModelGate, budget_stop
from engine.gates.metering import credits_stop
from record.models import Message, ModelCall


def _note(text: str) -> Message:
    return Message(turn=2, role="system", content=text)


def test_contributions_join_in_order_and_a_later_dialogue_state_wins() -> None:
    env, recheck = _note("env changed"), _note("precondition changed")
    call = ModelCall(endpoint_name="cheap")
    joined = Verdict.joined(
        Verdict.note(env),
        Verdict.note(None),
        Verdict(
            contribution=Contribution(
                blocks=("env block",), config={"a": 1}, dialogue_state={"intent": "x"}
            )
        ),
        Verdict.note(recheck),
        Verdict(
            contribution=Contribution(blocks=("said",), config={"a": 2, "b": 3}, calls=(call,))
        ),
    )
    assert joined.notes == (env, recheck)
    assert joined.blocks == ("env block", "said")
    assert joined.config == {"a": 2, "b": 3}
    assert joined.calls == (call,)
    assert joined.dialogue_state == {"intent": "x"}  # a part without one changes nothing
    assert Verdict.joined() == Contribution.join() == Contribution()


def _history() -> list[Any]:
    return [
        Message(turn=2, role="user", content="find my orders"),
        Message(turn=2, role="assistant", content="Found 3 orders so far."),
    ]


def test_a_spent_budget_stops_the_turn_with_what_it_has() -> None:
    allowed = ModelGate(level=0, endpoint=None, request=None, verdict=BudgetVerdict(allowed=True))  # type: ignore[arg-type]
    assert budget_stop(allowed, _history(), 2) == Verdict()
    spent = ModelGate(level=0, endpoint=None, request=None, verdict=BudgetVerdict(allowed=False))  # type: ignore[arg-type]
    stop = budget_stop(spent, _history(), 2).stop
    assert isinstance(stop, Stop)
    assert (stop.trigger, stop.stop_reason, stop.refused) == (
        "limit_reached",
        "budget_exceeded",
        "budget",
    )
    assert stop.content == f"Found 3 orders so far.\n\n({BUDGET_NOTE})"
    assert stop.reason.startswith("budget_exceeded: ")


def test_credits_stop_only_an_insufficient_check() -> None:
    assert credits_stop(None, _history(), 2) == Verdict()
    assert credits_stop(CreditsCheck("unmetered", 40), _history(), 2).stop is None
    assert credits_stop(CreditsCheck("ok", 40), _history(), 2).stop is None
    stop = credits_stop(CreditsCheck("insufficient", 40, 7, "balance"), [], 2).stop
    assert stop is not None and (stop.stop_reason, stop.refused) == (
        "insufficient_credits",
        "credits",
    )
    assert stop.content == "I had to stop here: credit points ran out (40 needed, 7 left)."
    assert stop.reason == "insufficient_credits: the model call needs 40 points, 7 left (balance)"
