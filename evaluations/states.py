"""An evaluation's states and the one table of allowed moves: pure Python."""

from enum import StrEnum


class EvaluationState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    CANCELLED = "cancelled"


ALLOWED: dict[EvaluationState, frozenset[EvaluationState]] = {
    EvaluationState.QUEUED: frozenset(
        {EvaluationState.RUNNING, EvaluationState.CANCELLED, EvaluationState.FAILED}
    ),
    EvaluationState.RUNNING: frozenset(
        {EvaluationState.FINISHED, EvaluationState.FAILED, EvaluationState.CANCELLED}
    ),
    EvaluationState.FINISHED: frozenset(),
    EvaluationState.FAILED: frozenset(),
    EvaluationState.CANCELLED: frozenset(),
}
ENDED = frozenset({EvaluationState.FINISHED, EvaluationState.FAILED, EvaluationState.CANCELLED})


def move_allowed(current: str, to: EvaluationState) -> bool:
    return to in ALLOWED.get(EvaluationState(current), frozenset())
