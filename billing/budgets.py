"""Budgets: tokens and cost per turn, per session and per day, for an agent and an owner.

Before a model call the engine asks `budget_check` with what each budget has spent so
far and an estimate of the call. The call runs as is if it fits; if only its output
would cross a budget, the request is made smaller (a lower output limit); otherwise it
is refused and the turn ends with what the agent has (`stop_reason: budget_exceeded`).
Exact accounting happens after the call, from the tokens the model reported.

The owner's sessions spend the `shared` budgets (a day, a month, a key's period) at once,
so an allowed call also holds its worst case against them before it is sent
(`services.budget_reserve`), and the step that records it gives the hold back.
"""

from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal

from .pricing import model_call_cost

# A smaller request is only worth sending if the model can still say something useful.
MIN_OUTPUT_TOKENS = 64


@dataclass(frozen=True)
class Budget:
    """One limit: `who` (agent or owner) per `period` (turn, session, day); None = no limit."""

    who: str
    period: str
    tokens: int | None = None
    cost: Decimal | None = None

    @property
    def label(self) -> str:
        return f"{self.who} {self.period}"

    @property
    def shared(self) -> bool:
        """Spent by the owner's sessions at once (a day, a month, a key's period), so a call
        holds its worst case against it before it is sent (`billing_budget_reserve`); a
        turn's or session's budget is spent by one step at a time."""
        return self.period in ("day", "month") and (
            self.tokens is not None or self.cost is not None
        )


@dataclass(frozen=True)
class Spent:
    tokens: int = 0
    cost: Decimal = Decimal(0)


@dataclass(frozen=True)
class CallEstimate:
    input_tokens: int
    output_tokens: int
    price_input_per_1k: Decimal = Decimal(0)
    price_output_per_1k: Decimal = Decimal(0)

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    @property
    def cost(self) -> Decimal:
        return model_call_cost(
            input_tokens=self.input_tokens,
            output_tokens=self.output_tokens,
            price_input_per_1k=self.price_input_per_1k,
            price_output_per_1k=self.price_output_per_1k,
        )


@dataclass(frozen=True)
class BudgetVerdict:
    allowed: bool
    # A lower output limit that makes the call fit, if one was needed.
    max_tokens: int | None = None
    exceeded: Budget | None = None
    # The highest share of any budget already spent (0..1+), a degradation pressure.
    used: float = 0.0

    @property
    def message(self) -> str:
        if self.exceeded is None:
            return ""
        return f"the {self.exceeded.label} budget does not cover another model call"


def _output_room(budget: Budget, spent: Spent, call: CallEstimate) -> float:
    """How many output tokens this budget leaves for the call after its input."""
    room = float("inf")
    if budget.tokens is not None:
        room = min(room, budget.tokens - spent.tokens - call.input_tokens)
    if budget.cost is not None:
        left = (budget.cost - spent.cost) * 1000 - call.input_tokens * call.price_input_per_1k
        if call.price_output_per_1k > 0:
            room = min(room, float(left / call.price_output_per_1k))
        elif left < 0:
            room = -1
    return room


def used_share(budgets: Iterable[tuple[Budget, Spent]]) -> float:
    share = 0.0
    for budget, spent in budgets:
        if budget.tokens:
            share = max(share, spent.tokens / budget.tokens)
        if budget.cost:
            share = max(share, float(spent.cost / budget.cost))
    return share


def budget_check(*, budgets: list[tuple[Budget, Spent]], call: CallEstimate) -> BudgetVerdict:
    used = used_share(budgets)
    room, tightest = float("inf"), None
    for budget, spent in budgets:
        if budget.tokens is None and budget.cost is None:
            continue
        this = _output_room(budget, spent, call)
        if this < room:
            room, tightest = this, budget
    if room >= call.output_tokens:
        return BudgetVerdict(True, used=used)
    if room >= MIN_OUTPUT_TOKENS:
        return BudgetVerdict(True, max_tokens=int(room), used=used)
    return BudgetVerdict(False, exceeded=tightest, used=used)
