"""`sustained` narrows the gap between the highest rate met and the lowest missed."""

from bench.sustained import rate_between


def rows(**met: bool) -> list[dict[str, object]]:
    return [{"rate": float(rate.removeprefix("r")), "met": ok} for rate, ok in met.items()]


def test_the_rate_between_is_halfway_from_the_highest_met_to_the_lowest_missed() -> None:
    assert rate_between(rows(r10=True, r20=True, r40=False)) == 30.0
    assert rate_between(rows(r10=True, r20=True, r40=False, r30=False)) == 25.0
    assert rate_between(rows(r10=True, r20=True, r40=False, r30=True)) == 35.0


def test_nothing_between_when_no_rate_missed_or_the_gap_is_narrow() -> None:
    assert rate_between(rows(r10=True, r20=True)) is None
    assert rate_between(rows(r20=True, r25=False)) is None


def test_a_first_rate_that_misses_is_halved_towards_zero() -> None:
    assert rate_between(rows(r10=False)) == 5.0
