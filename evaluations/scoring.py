"""Scores of a replayed turn beside its recorded baseline, and an evaluation's totals.

A turn's `calls` are [{"tool", "arguments", "step"}] in the order they were made; the
trajectory matches when every step asked for the same calls (tool and arguments; the
calls of one step run together, so their order inside it does not matter) in the same
order of steps. Ratios are the candidate's figure over the baseline's (1.0 when both are
zero); matches are shares from 0 to 1.
"""

import json
import math
from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Any, TypedDict


class Side(TypedDict):
    calls: list[dict[str, Any]]
    outcome: str
    answer: str
    input_tokens: int
    output_tokens: int
    cost: str
    latency_ms: int


class TurnScore(TypedDict):
    trajectory_match: bool
    outcome_match: bool
    answer_exact: bool
    answer_similarity: float


def _steps(calls: Sequence[dict[str, Any]]) -> list[list[str]]:
    by_step: dict[int, list[str]] = {}
    for call in calls:
        text = json.dumps(
            [call["tool"], call.get("arguments")], sort_keys=True, separators=(",", ":")
        )
        by_step.setdefault(int(call.get("step", 0)), []).append(text)
    return [sorted(by_step[s]) for s in sorted(by_step)]


def trajectory_match(
    baseline: Sequence[dict[str, Any]], candidate: Sequence[dict[str, Any]]
) -> bool:
    return _steps(baseline) == _steps(candidate)


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    norm = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return 0.0 if norm == 0 else max(0.0, min(1.0, dot / norm))


def turn_score(
    baseline: Side, candidate: Side, embed: Callable[[list[str]], list[list[float]]]
) -> TurnScore:
    """The turn's comparison; the answers' similarity from `embed` (the configured
    embedder), 1.0 for the same text without asking it."""
    same = baseline["answer"].strip() == candidate["answer"].strip()
    if same:
        similarity = 1.0
    elif not baseline["answer"].strip() or not candidate["answer"].strip():
        similarity = 0.0
    else:
        first, second = embed([baseline["answer"], candidate["answer"]])
        similarity = round(cosine(first, second), 4)
    return TurnScore(
        trajectory_match=trajectory_match(baseline["calls"], candidate["calls"]),
        outcome_match=baseline["outcome"] == candidate["outcome"],
        answer_exact=same,
        answer_similarity=similarity,
    )


def ratio(candidate: float | Decimal, baseline: float | Decimal) -> float | None:
    """candidate / baseline; 1.0 when both are zero, None when only the baseline is."""
    if not baseline:
        return 1.0 if not candidate else None
    return round(float(candidate) / float(baseline), 4)


def totals(turns: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """An evaluation's totals over its scored turns (rows with `baseline`, `candidate` and
    the TurnScore fields)."""
    n = len(turns)
    if not n:
        return {"turns": 0}

    def share(key: str) -> float:
        return round(sum(1 for t in turns if t[key]) / n, 4)

    def total(side: str, key: str) -> Decimal:
        return sum((Decimal(str(t[side].get(key) or 0)) for t in turns), Decimal(0))

    judged = [t["judge_score"] for t in turns if t.get("judge_score") is not None]
    tokens = {
        side: total(side, "input_tokens") + total(side, "output_tokens")
        for side in ("baseline", "candidate")
    }
    return {
        "turns": n,
        "trajectory_match": share("trajectory_match"),
        "outcome_match": share("outcome_match"),
        "answer_exact": share("answer_exact"),
        "answer_similarity": round(sum(t["answer_similarity"] for t in turns) / n, 4),
        "judge_score": round(sum(judged) / len(judged), 4) if judged else None,
        "tokens_ratio": ratio(tokens["candidate"], tokens["baseline"]),
        "cost_ratio": ratio(total("candidate", "cost"), total("baseline", "cost")),
        "latency_ratio": ratio(total("candidate", "latency_ms"), total("baseline", "latency_ms")),
        "would_have_called": sum(len(t["candidate"].get("would_have_called", [])) for t in turns),
    }
