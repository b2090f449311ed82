"""What a model step spent: tokens, cost and the ModelCall rows that record them."""

from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import Decimal

from record.events import UsageTotals
from record.models import ModelCall, Session


@dataclass(frozen=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    cost: Decimal = Decimal(0)

    @classmethod
    def of_calls(cls, calls: Iterable[ModelCall]) -> "Usage":
        calls = list(calls)
        return cls(
            input_tokens=sum(c.input_tokens for c in calls),
            output_tokens=sum(c.output_tokens for c in calls),
            cost=sum((c.cost for c in calls), Decimal(0)),
        )

    def plus(self, other: "Usage") -> "Usage":
        return Usage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.cost + other.cost,
        )

    def add_fields(self) -> dict[str, int | Decimal]:
        """The session counters a step adds this usage to."""
        return {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cost": self.cost,
        }

    def totals(self, session: Session) -> UsageTotals:
        """The session's running totals once this usage is counted (as `turn.finished` reports them)."""
        return {
            "input_tokens": session.input_tokens + self.input_tokens,
            "output_tokens": session.output_tokens + self.output_tokens,
            "cost": str(session.cost + self.cost),
        }


@dataclass(frozen=True)
class ModelSpend:
    """What one model step commits besides its outcome: usage, the ModelCall rows, and the
    iteration it counts as. `answered` is False when the call was cut short by a cancel:
    only an answer clears a pending environment check."""

    calls: list[ModelCall] = field(default_factory=list)
    iteration: int = 0
    answered: bool = True

    @property
    def usage(self) -> Usage:
        return Usage.of_calls(self.calls)

    def set_fields(self) -> dict[str, object]:
        if self.answered:
            return {"iteration": self.iteration, "resume_check": False}
        return {"iteration": self.iteration}
