"""similarity x time decay x importance, without a database."""

from datetime import UTC, datetime, timedelta

import pytest

from memory.scoring import importance_weight, memory_score, time_decay

NOW = datetime(2026, 6, 1, tzinfo=UTC)


def test_decay_halves_each_half_life_and_has_a_floor():
    assert time_decay(0) == 1.0
    assert time_decay(30, 30) == pytest.approx(0.5)
    assert time_decay(60, 30) == pytest.approx(0.25)
    assert time_decay(10_000, 30) == 0.1  # an old preference still counts a little
    assert time_decay(-5, 30) == 1.0  # a clock skew never boosts
    assert time_decay(100, 0) == 1.0  # no decay configured


def test_importance_ranks_but_never_erases():
    assert importance_weight(0) == 0.5 and importance_weight(1) == 1.0
    assert importance_weight(7) == 1.0 and importance_weight(-1) == 0.5


def test_score_multiplies_the_three():
    fresh = memory_score(similarity=0.8, used_at=NOW, now=NOW, importance=1.0)
    assert fresh == pytest.approx(0.8)
    month_old = memory_score(
        similarity=0.8, used_at=NOW - timedelta(days=30), now=NOW, importance=1.0
    )
    assert month_old == pytest.approx(0.4)
    unimportant = memory_score(similarity=0.8, used_at=NOW, now=NOW, importance=0.0)
    assert unimportant == pytest.approx(0.4)
    assert memory_score(similarity=-0.3, used_at=NOW, now=NOW, importance=1.0) == 0.0


def test_a_fresh_close_item_beats_an_old_closer_one_only_past_the_decay():
    old_close = memory_score(
        similarity=0.9, used_at=NOW - timedelta(days=90), now=NOW, importance=0.5
    )
    new_near = memory_score(similarity=0.6, used_at=NOW, now=NOW, importance=0.5)
    assert new_near > old_close
