"""Scores of a replayed turn (pure Python): the trajectory compares steps in order and the
calls of one step as a set; ratios are candidate ÷ baseline; totals are shares and means."""

from evaluations.judge import judge_score_parse
from evaluations.scoring import Side, ratio, totals, trajectory_match, turn_score


def _call(tool: str, step: int, **arguments: object) -> dict[str, object]:
    return {"tool": tool, "arguments": arguments, "step": step}


def test_calls_made_together_may_come_in_any_order_but_steps_may_not() -> None:
    baseline = [_call("a", 0, x=1), _call("b", 0), _call("c", 1)]
    assert trajectory_match(baseline, [_call("b", 0), _call("a", 0, x=1), _call("c", 1)])
    assert not trajectory_match(baseline, [_call("c", 0), _call("a", 1, x=1), _call("b", 1)])
    assert not trajectory_match(baseline, [_call("a", 0, x=2), _call("b", 0), _call("c", 1)])
    assert not trajectory_match(baseline, baseline[:2])


def _side(answer: str, cost: str = "0.001", **fields: object) -> Side:
    side = {
        "calls": [],
        "outcome": "ok",
        "answer": answer,
        "input_tokens": 10,
        "output_tokens": 5,
        "cost": cost,
        "latency_ms": 100,
    }
    side.update(fields)
    return side  # type: ignore[return-value]


def test_the_same_answer_needs_no_embedder_and_another_asks_it() -> None:
    def never(texts: list[str]) -> list[list[float]]:
        raise AssertionError("not asked for the same text")

    assert turn_score(_side("Done."), _side(" Done. "), never)["answer_similarity"] == 1.0
    score = turn_score(_side("yes"), _side("no"), lambda texts: [[1.0, 0.0], [0.6, 0.8]])
    assert (score["answer_exact"], score["answer_similarity"]) == (False, 0.6)
    assert turn_score(_side("yes"), _side(""), never)["answer_similarity"] == 0.0


def test_ratios_and_totals() -> None:
    assert ratio(2, 4) == 0.5 and ratio(0, 0) == 1.0 and ratio(1, 0) is None
    rows = [
        {
            "trajectory_match": True,
            "outcome_match": True,
            "answer_exact": True,
            "answer_similarity": 1.0,
            "baseline": _side("a", cost="0.002"),
            "candidate": _side("a", cost="0.001"),
        },
        {
            "trajectory_match": False,
            "outcome_match": True,
            "answer_exact": False,
            "answer_similarity": 0.5,
            "baseline": _side("a", cost="0.002"),
            "candidate": _side("b", cost="0.001", would_have_called=[{"tool": "x"}]),
        },
    ]
    got = totals(rows)
    assert got["turns"] == 2
    assert (got["trajectory_match"], got["outcome_match"], got["answer_similarity"]) == (
        0.5,
        1.0,
        0.75,
    )
    assert (got["cost_ratio"], got["tokens_ratio"], got["would_have_called"]) == (0.5, 1.0, 1)
    assert got["judge_score"] is None
    assert totals([]) == {"turns": 0}


def test_a_judges_reply_is_read_forgivingly_and_bounded() -> None:
    assert judge_score_parse('{"score": 0.8, "reason": "fine"}') == 0.8
    assert judge_score_parse('Sure! {"score": 1.5}') == 1.0
    assert judge_score_parse("no idea") is None
    assert judge_score_parse('{"score": "high"}') is None
