"""Loop guards: repeated calls, results that bring nothing new, cycles; a fan-out is not a loop."""

from datetime import timedelta

import pytest
from django.utils import timezone

from engine.gates import guards
from engine.gates.guards import CallRecord, GuardLimits, check, nearly_same
from engine.phases.model import loop_stop
from record.models import ToolCall


def step(*calls: tuple[str, dict, object], status: str = "success") -> list[CallRecord]:
    """One model response's calls: (tool, arguments, output)."""
    return [CallRecord(tool, arguments, output, status) for tool, arguments, output in calls]


def search(query: str, output: object = None) -> list[CallRecord]:
    return step(("search", {"query": query}, output if output is not None else {"hits": [query]}))


# repeated calls -------------------------------------------------------------------------------


def test_the_same_call_three_times_in_a_row_is_a_repeated_call():
    steps = [search("red shoes size 42")] * 3
    verdict = check(steps).intent
    assert verdict is not None and verdict.stop_reason == "repeated_call"
    assert "search 3 times in a row" in verdict.note
    assert "do not call it again" in verdict.note


def test_two_identical_calls_are_not_yet_a_loop():
    assert check([search("red shoes size 42")] * 2).intent is None


def test_nearly_the_same_arguments_count_as_the_same_call():
    steps = [
        search("red shoes size 42", {"hits": [1]}),
        search("red shoes, size 42", {"hits": [2]}),
        search("Red shoes size 42", {"hits": [3]}),
    ]
    verdict = check(steps).intent
    assert verdict is not None and verdict.stop_reason == "repeated_call"


def test_clearly_different_arguments_are_progress():
    steps = [search("red shoes"), search("blue umbrella for two"), search("a warm winter coat")]
    assert check(steps).intent is None


def test_looking_up_one_record_after_another_is_progress():
    # The arguments differ in one character only, but it is the identifier that differs.
    orders = [
        step(("get_order", {"number": f"SO-100{i}"}, {"number": f"SO-100{i}"})) for i in range(1, 5)
    ]
    assert check(orders).intent is None
    coupons = [
        step(("issue_coupon", {"customer_id": c, "amount": 10}, {"code": f"C{c}"}))
        for c in (17, 18, 19)
    ]
    assert check(coupons).intent is None
    pages = [step(("search", {"query": "shoes", "page": p}, {"hits": [p]})) for p in (1, 2, 3)]
    assert check(pages).intent is None


def test_a_repeat_that_is_not_consecutive_is_not_a_repeated_call():
    steps = [
        search("red shoes size 42"),
        search("blue umbrella"),
        search("red shoes size 42"),
        search("a warm coat"),
    ]
    assert check(steps).intent is None


def test_the_same_arguments_to_a_different_tool_are_a_different_call():
    steps = [
        step(("search", {"query": "x"}, {"n": 1})),
        step(("lookup", {"query": "x"}, {"n": 2})),
        step(("search", {"query": "x"}, {"n": 3})),
    ]
    assert check(steps).intent is None


def test_the_repeat_limit_is_per_agent():
    steps = [search("red shoes size 42", {"hits": [i]}) for i in range(4)]
    assert check(steps[:2], GuardLimits(repeat_limit=2)).intent.stop_reason == "repeated_call"  # type: ignore[union-attr]
    assert check(steps[:4], GuardLimits(repeat_limit=5)).intent is None
    verdict = check(
        [*steps, search("red shoes size 42", {"hits": [9]})], GuardLimits(repeat_limit=5)
    ).intent
    assert verdict is not None and verdict.stop_reason == "repeated_call"
    assert "5 times in a row" in verdict.note


# no new information ------------------------------------------------------------------------------


def test_the_same_result_three_times_in_a_row_brings_no_new_information():
    same = {"count": 0, "orders": []}
    steps = [
        step(("query_orders", {"days": 7}, same)),
        step(("query_orders", {"days": 30, "logistics_status": "exception"}, same)),
        step(
            ("query_orders", {"days": 90, "logistics_status": "delayed", "region": "north"}, same)
        ),
    ]
    verdict = check(steps).intent
    assert verdict is not None and verdict.stop_reason == "no_new_information"
    assert "last 3 results of query_orders were identical" in verdict.note


def test_a_result_repeated_once_is_still_fine():
    same = {"count": 0}
    steps = [
        step(("query_orders", {"days": 7}, {"count": 4})),
        step(("query_orders", {"days": 30, "region": "all"}, same)),
        step(("query_orders", {"days": 90, "logistics_status": "ok"}, same)),
    ]
    assert check(steps).intent is None


def test_identical_failures_are_not_no_new_information():
    steps = [
        step(("query_orders", {"days": "seven"}, None), status="failed"),
        step(("query_orders", {"since": "last week", "x": 1}, None), status="failed"),
        step(("query_orders", {"period": {"from": "2025-01-01"}}, None), status="failed"),
    ]
    assert check(steps).intent is None


def test_the_same_result_limit_is_per_agent():
    same = {"count": 0}
    steps = [
        step(("query_orders", {"days": 7}, same)),
        step(("query_orders", {"days": 30, "logistics_status": "exception"}, same)),
    ]
    assert check(steps).intent is None
    verdict = check(steps, GuardLimits(same_result_limit=1)).intent
    assert verdict is not None and verdict.stop_reason == "no_new_information"


# cycles ---------------------------------------------------------------------------------------


def test_two_calls_taking_turns_are_a_cycle():
    a = step(("get_order", {"number": "SO-1001"}, {"status": "exception"}))
    b = step(("get_customer", {"customer_id": 17}, {"name": "Ada Lovelace"}))
    assert check([a, b, a]).intent is None
    verdict = check([a, b, a, b]).intent
    assert verdict is not None and verdict.stop_reason == "cycle"
    assert "get_order -> get_customer" in verdict.note


def test_a_longer_cycle_is_found_too():
    a = step(("get_order", {"number": "SO-1001"}, {"status": "exception"}))
    b = step(("get_customer", {"customer_id": 17}, {"name": "Ada"}))
    c = step(("get_carrier", {"tracking": "ZX-99-ABC"}, {"carrier": "DHL"}))
    assert check([a, b, c, a, b]).intent is None
    verdict = check([a, b, c, a, b, c]).intent
    assert verdict is not None and verdict.stop_reason == "cycle"
    assert "get_order -> get_customer -> get_carrier" in verdict.note


def test_a_pattern_seen_once_is_not_a_cycle():
    a = step(("get_order", {"number": "SO-1001"}, {"s": 1}))
    b = step(("get_customer", {"customer_id": 17}, {"n": 2}))
    c = step(("get_carrier", {"tracking": "ZX-99-ABC"}, {"c": 3}))
    assert check([a, b, c, b, a, c]).intent is None


# fan-out --------------------------------------------------------------------------------------


def _notify(customer: int) -> tuple[str, dict, object]:
    return (
        "send_notification",
        {"customer_id": customer, "message": "Your parcel is late."},
        {"ok": True, "id": customer},
    )


def test_a_fan_out_in_one_step_is_not_a_loop():
    fan_out = step(*[_notify(c) for c in range(1, 6)])
    assert check([fan_out]).intent is None
    steps = [
        step(("query_orders", {"days": 7}, {"count": 5})),
        fan_out,
        step(("generate_report", {"title": "Late parcels", "lines": ["a"]}, {"report_id": 1})),
    ]
    assert check(steps).intent is None


def test_many_identical_calls_in_one_step_are_not_a_loop_either():
    assert check([step(*[_notify(1)] * 8)]).intent is None
    assert (
        check(
            [step(("query_orders", {"days": 7}, {"count": 0}))] + [step(*[_notify(1)] * 8)]
        ).intent
        is None
    )


def test_the_same_fan_out_repeated_three_times_is_a_loop():
    fan_out = step(*[_notify(c) for c in range(1, 4)])
    verdict = check([fan_out, fan_out, fan_out]).intent
    assert verdict is not None and verdict.stop_reason == "repeated_call"
    assert "send_notification" in verdict.note


def test_empty_steps_are_ignored():
    a = search("red shoes size 42")
    assert check([a, [], a, [], a]).intent.stop_reason == "repeated_call"  # type: ignore[union-attr]
    assert check([]).intent is None


def test_nearly_same():
    assert nearly_same({"q": "red shoes size 42"}, {"q": "red shoes size 42"})
    assert nearly_same({"q": "red shoes size 42"}, {"q": "red shoes, size 42"})
    assert nearly_same({"a": 1, "b": 2}, {"b": 2, "a": 1})  # key order does not matter
    assert not nearly_same({"q": "red shoes"}, {"q": "a blue umbrella"})
    assert not nearly_same({"number": "SO-1001"}, {"number": "SO-1002"})
    assert not nearly_same({"days": 7}, {"days": 8})
    assert not nearly_same({"q": "x"}, {"q": "x", "page": 2})  # another field is another call
    assert not nearly_same({"ids": [1, 2]}, {"ids": [1, 2, 3]})
    assert nearly_same(
        {"ids": [1, 2], "q": {"text": "red shoes size 42"}},
        {"ids": [1, 2], "q": {"text": "red shoes size 42!"}},
    )
    assert not nearly_same({"flag": 1}, {"flag": True})


# the runner's verdict, from the database, with the agent's limits -------------------------------


def _calls(session, steps: list[list[tuple[str, dict, object]]]) -> None:  # type: ignore[no-untyped-def]
    rows = [
        ToolCall(
            session=session, turn=session.turn, step=number, position=position, call_id=f"c{number}-{position}",
            tool_name=tool, input=arguments, output=output, status="success",
            idempotency_key=f"{session.pk}:{number}:{position}",
        )
        for number, calls in enumerate(steps, start=1)
        for position, (tool, arguments, output) in enumerate(calls)
    ]  # fmt: skip
    ToolCall.objects.bulk_create(rows)


@pytest.mark.django_db
def test_loop_stop_reads_the_turns_calls_and_applies_the_agents_limits(make_agent, make_session):
    agent = make_agent(repeat_call_limit=2, same_result_limit=5, max_iterations=8)
    session = make_session(agent=agent)
    session.turn, session.iteration, session.turn_started_at = 1, 2, timezone.now()
    _calls(
        session,
        [[("search", {"query": "shoes"}, {"n": 1})], [("search", {"query": "shoes"}, {"n": 2})]],
    )

    verdict = loop_stop(session, agent)

    assert verdict is not None and verdict.stop_reason == "repeated_call"
    agent.repeat_call_limit = 3
    assert loop_stop(session, agent) is None
    # Calls of an earlier turn do not count.
    session.turn = 2
    agent.repeat_call_limit = 2
    assert loop_stop(session, agent) is None


@pytest.mark.django_db
def test_loop_stop_max_iterations_and_turn_timeout(make_agent, make_session):
    agent = make_agent(max_iterations=3, turn_timeout_s=60)
    session = make_session(agent=agent)
    session.turn, session.turn_started_at = 1, timezone.now()

    session.iteration = 0
    assert loop_stop(session, agent) is None
    session.iteration = 3
    assert loop_stop(session, agent).stop_reason == "max_iterations"  # type: ignore[union-attr]

    session.iteration = 1
    session.turn_started_at = timezone.now() - timedelta(seconds=61)
    verdict = loop_stop(session, agent)
    assert verdict is not None and verdict.stop_reason == "turn_timeout"
    assert "past its limit of 60 s" in verdict.note


@pytest.mark.django_db
def test_loop_stop_does_not_judge_before_two_iterations(make_agent, make_session):
    agent = make_agent(repeat_call_limit=2)
    session = make_session(agent=agent)
    session.turn, session.iteration, session.turn_started_at = 1, 1, timezone.now()
    _calls(
        session,
        [[("search", {"query": "shoes"}, {"n": 1})], [("search", {"query": "shoes"}, {"n": 1})]],
    )
    assert loop_stop(session, agent) is None


def test_a_turns_records_are_hashed_once_however_often_they_are_judged(monkeypatch):
    """The run judges its turn's records again at every model step: each record's
    argument text and result digest are made once, the first time they are needed."""
    made: list[object] = []
    original = guards.canonical_json

    def canonical_json(value: object) -> str:
        made.append(value)
        return original(value)

    monkeypatch.setattr(guards, "canonical_json", canonical_json)
    steps = [search(f"query {i}", {"hits": [i]}) for i in range(6)]
    for n in range(1, len(steps) + 1):
        assert check(steps[:n]).intent is None
    # Each record: its arguments once and its result once (for the digest), at most.
    arguments = [c.arguments for s in steps for c in s]
    outputs = [c.output for s in steps for c in s]
    assert all(sum(m is a for m in made) == 1 for a in arguments), made
    assert all(sum(m is o for m in made) <= 1 for o in outputs), made
    assert check(steps).intent is None and len(made) == len(arguments) + sum(
        any(m is o for m in made) for o in outputs
    )
