"""Gates: each reads what it needs and judges; none makes a move, writes the record or
calls a port's writer (the phase that consults it does, from what the gate returns: the
cost notices a budget read crossed, the memory items a block placed). A port's atomic
check-and-take (a budget hold, a credit reservation, a pool grant, a rate limit's token)
is a gate's: the check and the take are one statement (`TAKES` in
tests/architecture/test_gates.py). No gate imports another: what several need lives on
the model floor below.

Every gate answers a `Verdict`, filled as the step that asks it reads it:

- a tool step's gates answer on the step's calls: the calls it settles (their
  outcomes: they do not run), whether the step waits (`Wait`: for a person, the children,
  the credit pool, a probe), the events the step's commit announces, and its `intent`:
  what the phase writes for it (the approvals to ask for, the children to start, the
  probes to record, the handoff chosen);
- a model step's gates answer on the request: its `stop` (a `Stop`: the
  turn ends here, with this answer) or its `contribution` (a `Contribution`: notes the
  model reads, context blocks, request configuration, the engine's own model calls, a new
  dialogue state). Contributions add up (`Verdict.joined`) and ride on the step's one
  commit.

A loop guard's verdict (guards.check) carries its `intent`, a `GuardVerdict`: the step is
made final (no tools, this note).

Not gates, and so not verdicts: the reads and helpers a phase calls beside them, each in
its own shape: the budget gate's read (`gate_read` → `GateRead`), the call priced and
held (`model_gate`, `budget_hold` → `ModelGate`, judged by `budget_stop`'s verdict), the
endpoint's rate limit (`model_rate_limit`, waits or raises), the memory block
(`turn_memory_block` → `MemoryBlock`) and the end-of-turn memory decision
(`extraction_decide` → `Decided`), the routing (`route` → `Route`, `escalation`), the
turn's options (`turn_options` → `TurnOptions`, `with_turn_options`), the guards' limits
(`GuardLimits`) and their notes' texts.

Waits that unwind the run (the runner catches them) stay exceptions: `StepDeferred`,
`CreditsWait`, `ChildrenWait`.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from engine.model.environment import Seen
from record.events import EventSpec, StopReason
from record.models import Message, ModelCall
from record.states import Trigger
from tools.execution import ToolOutcome

Intent = TypeVar("Intent")


@dataclass(frozen=True)
class Wait:
    """The tool step waits: `on` whom or what (a person, the children, the credit pool, a
    probe), and at most `after_s` seconds (None: until something wakes the run)."""

    on: str
    after_s: float | None = None


@dataclass(frozen=True)
class Stop:
    """A gate's verdict that the turn ends here, with this answer."""

    trigger: Trigger
    stop_reason: StopReason
    content: str  # what the user reads
    reason: str  # the transition's reason, for the operator
    refused: str  # what was refused, the budget_refusals metric's label


@dataclass(frozen=True)
class Contribution:
    """What a gate adds to a model step."""

    # Messages the model reads after the history, committed with the step (a note on what
    # changed in the environment, on preconditions that no longer hold).
    notes: tuple[Message, ...] = ()
    # Context blocks (environment, dialogue state, extra context), in order.
    blocks: tuple[str, ...] = ()
    # Merged into the request's agent_config, for policies (llm/rules.py reads them).
    config: dict[str, Any] = field(default_factory=dict)
    # The engine's own model calls of this step (e.g. the dialogue-state extractor),
    # committed and metered with the step.
    calls: tuple[ModelCall, ...] = ()
    # The session's new dialogue state for this step's commit; None: unchanged.
    dialogue_state: dict[str, Any] | None = None
    # What the model sees of its situation this step (engine/model/environment.py `Seen`),
    # recorded by the step's checkpoint for the drift check after a pause.
    seen: Seen | None = None

    @classmethod
    def note(cls, message: Message | None) -> "Contribution":
        return cls(notes=(message,) if message is not None else ())

    @classmethod
    def join(cls, *parts: "Contribution") -> "Contribution":
        """The parts in order; a later part's dialogue state, seen or configuration key wins."""
        config: dict[str, Any] = {}
        state: dict[str, Any] | None = None
        seen: Seen | None = None
        for part in parts:
            config.update(part.config)
            state = part.dialogue_state if part.dialogue_state is not None else state
            seen = part.seen if part.seen is not None else seen
        return cls(
            notes=tuple(n for part in parts for n in part.notes),
            blocks=tuple(b for part in parts for b in part.blocks),
            config=config,
            calls=tuple(c for part in parts for c in part.calls),
            dialogue_state=state,
            seen=seen,
        )


@dataclass(frozen=True)
class Verdict(Generic[Intent]):
    """Every gate's one answer: a tool step's on its calls (what it settles, a wait, the
    events, the intent the phase writes), a model step's on its request (a stop, or what
    it adds). A field a step does not read stays empty."""

    # The calls it settles, by id: they do not run; the model reads these outcomes.
    settled: Mapping[int, ToolOutcome] = field(default_factory=dict)
    # The step waits (the phase pauses or parks the session); None: it goes on.
    wait: Wait | None = None
    # Announced by the step's commit (a child finished, credits ran low).
    events: tuple[EventSpec, ...] = ()
    # What the phase writes for it: the approvals to ask for, the children to start...
    intent: Intent | None = None
    # A model step's: the turn ends here, with this answer (no model call).
    stop: Stop | None = None
    # A model step's: what the gate adds to the request; the phase joins them
    # (`Verdict.joined`) and they ride on the step's one commit.
    contribution: Contribution = field(default_factory=Contribution)

    @classmethod
    def note(cls, message: Message | None) -> "Verdict[Any]":
        """A model-step verdict that adds one note the model reads (none: adds nothing)."""
        return cls(contribution=Contribution.note(message))

    @staticmethod
    def joined(*verdicts: "Verdict[Any]") -> Contribution:
        """What these model-step verdicts add, in order (`Contribution.join`)."""
        return Contribution.join(*(v.contribution for v in verdicts))


BUDGET_NOTE = "I had to stop here: the budget for this request is used up."


def partial_answer(history: list, turn: int, note: str = BUDGET_NOTE) -> str:
    """What the agent has so far this turn: its last words to the user, or a short note."""
    for message in reversed(history):
        if message.turn != turn:
            break
        if message.role == "assistant" and message.content.strip():
            return f"{message.content.strip()}\n\n({note})"
    return note
