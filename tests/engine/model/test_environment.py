"""The drift distance (engine/model/environment.py): what each change weighs, and what is
compared when one side did not record it."""

from engine.model.environment import Seen, drift

ENV = {"agent": "a1", "tools": {"pay": "t1", "ship": "s1"}, "model": "m1"}
SEEN: Seen = {
    "intent": "refund",
    "slots": {"order": "SO-1", "carrier": "DHL"},
    "degradation": 0,
    "degraded": [],
    "budgets": {"owner day": 90},
}


def test_nothing_changed_is_no_drift():
    found = drift(ENV, dict(ENV), SEEN, Seen(**SEEN))
    assert (found.changes, found.distance, found.above(0.1)) == ([], 0, False)


def test_what_the_agent_is_weighs_one_each():
    now = {"agent": "a2", "tools": {"pay": "t2", "refund": "r1"}, "model": "m2"}
    found = drift(ENV, now, None, None)
    assert found.texts == [
        "the agent's instructions or configuration were changed",
        "tools now available: refund",
        "tools no longer available: ship",
        "tools whose definition changed: pay",
        "the model changed from m1 to m2",
    ]
    assert found.distance == 5.0


def test_the_situation_adds_up_by_weight():
    now: Seen = {
        "intent": "track",
        "slots": {"order": "SO-2", "note": "leave at door"},
        "degradation": 2,
        "degraded": ["tool ship: unavailable (circuit open)"],
        "budgets": {"owner day": 35},
    }
    found = drift(ENV, dict(ENV), SEEN, now)
    assert dict(found.changes) == {
        "the user's intent is now track (was refund)": 0.5,
        "carrier is no longer set (was DHL)": 0.5,
        "note is now leave at door": 0.5,
        "order is now SO-2 (was SO-1)": 0.5,
        "the service's degradation level went from 0 to 2": 1.0,
        "tool ship: unavailable (circuit open)": 0.5,
        "budget owner day: 35 % left (was 90 %)": 1.0,  # 55 points: two steps of 25
    }
    assert found.distance == 4.5


def test_small_moves_stay_under_the_default_threshold():
    now: Seen = {**SEEN, "slots": {"order": "SO-2", "carrier": "DHL"}, "budgets": {"owner day": 70}}
    found = drift(ENV, dict(ENV), SEEN, now)
    assert found.texts == ["order is now SO-2 (was SO-1)"]  # 20 budget points: not a change
    assert not found.above(1.0) and found.above(0.5)


def test_a_service_back_and_what_one_side_did_not_record():
    before: Seen = {**SEEN, "degraded": ["model main: unavailable (circuit open)"]}
    now: Seen = {"intent": "refund", "slots": SEEN["slots"], "degradation": 0, "degraded": []}
    found = drift(None, ENV, before, now)  # no budgets read now, no environment recorded
    assert found.texts == ["model main: available again"]


def test_the_world_crossing_a_line_weighs_one_each():
    """The article's example (is_peak_hour flips) and its kin: each is a drift by itself."""
    before: Seen = {**SEEN, "peak": True, "pressure": [], "below_sla": [], "quota_out": ["sms"]}
    now: Seen = {
        **SEEN,
        "peak": False,
        "pressure": ["memory"],
        "below_sla": ["logistics"],
        "quota_out": [],
    }
    found = drift(ENV, dict(ENV), before, now)
    assert dict(found.changes) == {
        "the peak hours are over (is_peak_hour false)": 1.0,
        "the host is under memory pressure": 1.0,
        "tool logistics: success rate under its SLA": 1.0,
        "tool sms: quota available again": 1.0,
    }
    back = drift(ENV, dict(ENV), now, before)
    assert dict(back.changes) == {
        "it is now peak hours (is_peak_hour true)": 1.0,
        "the host's memory pressure is over": 1.0,
        "tool logistics: back within its SLA": 1.0,
        "tool sms: quota used up": 1.0,
    }
    only_peak = drift(ENV, dict(ENV), before, {**before, "peak": False})
    assert only_peak.above(1.0)  # the default ENV_DRIFT_THRESHOLD


def test_a_step_recorded_before_the_world_was_seen_compares_none_of_it():
    """Checkpoints from before these fields (or an agent without peak hours) have no key:
    nothing to compare, no drift."""
    now: Seen = {**SEEN, "peak": False, "pressure": ["cpu"], "below_sla": ["x"], "quota_out": []}
    assert drift(ENV, dict(ENV), SEEN, now).changes == []
