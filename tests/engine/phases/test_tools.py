"""The tool loop in-process (message_post + session_run, no worker) against a scripted model on
the fake OpenAI-compatible server: feedback and correction, role gating, concurrency, loop guards,
time limits, the read-only cache, and idempotency keys when a tool step runs again.

`transaction=True`: tools run on helper threads with their own database connections.
"""

import threading
import time
import uuid
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from demo.models import ApiRequestLog, Coupon
from demo.services import demo_data_seed
from engine.model.context import FINAL_INSTRUCTION, LIMIT_NOTE
from engine.phases import tools as tool_phase
from engine.runner import loop as runner
from engine.runner.lease import lease_acquire, lease_drop
from record.models import Event, Message, Session, ToolCall, Transition
from sessions.services import message_post
from tests.factories import ToolFactory
from tests.fakes.model_servers import Call, FakeModelServer, Recorded, Reply
from tests.tools.http_server import Answer, ScriptedApi
from tools.execution import FAILURE_MARKER
from tools.registry import tool_handler
from tools.validation import MAX_ARGUMENT_BYTES

pytestmark = pytest.mark.django_db(transaction=True)

RAN: Counter[str] = Counter()
STARTED: list[float] = []
# Where the concurrency test's three calls meet: each waits there for the other two, so
# only calls running at the same time get past it (run one after another, the first would
# wait alone). The timeout only keeps a broken engine from hanging the test: it is a
# backstop, not a bound the test measures, so it is generous for a slow, loaded machine.
MEETING = threading.Barrier(3)
MEETING_TIMEOUT_S = 5.0  # under the tools' own 10 s limit: the call fails, it does not time out


@pytest.fixture(autouse=True)
def _forget_calls() -> None:
    RAN.clear()
    STARTED.clear()
    MEETING.reset()


@tool_handler("tests.loop.count_orders")
def _count_orders(days: int, status: str = "exception") -> dict[str, Any]:
    RAN["count_orders"] += 1
    return {"count": 3, "days": days, "status": status}


@tool_handler("tests.loop.wipe")
def _wipe() -> dict[str, Any]:
    RAN["wipe"] += 1
    return {"wiped": True}


@tool_handler("tests.loop.nap")
def _nap(n: int) -> dict[str, Any]:
    STARTED.append(time.monotonic())
    time.sleep(0.2)
    return {"n": n}


@tool_handler("tests.loop.meet")
def _meet(n: int) -> dict[str, Any]:
    MEETING.wait(timeout=MEETING_TIMEOUT_S)  # BrokenBarrierError (the call fails) if alone
    # Past the meeting, the later calls finish first: the results' order is the model's,
    # not the order they finished in (not asserted: only the meeting is certain).
    time.sleep(0.05 * (2 - n))
    return {"n": n}


@tool_handler("tests.loop.search")
def _search(query: str) -> dict[str, Any]:
    RAN["search"] += 1
    return {"query": query, "hits": len(query)}


@tool_handler("tests.loop.search_nothing")
def _search_nothing(query: str) -> dict[str, Any]:
    RAN["search_nothing"] += 1
    return {"hits": 0, "items": []}


@tool_handler("tests.loop.get_order")
def _get_order(number: str) -> dict[str, Any]:
    RAN["get_order"] += 1
    return {"number": number, "customer_id": 17, "status": "exception"}


@tool_handler("tests.loop.get_customer")
def _get_customer(customer_id: int) -> dict[str, Any]:
    RAN["get_customer"] += 1
    return {"customer_id": customer_id, "name": "Ada Lovelace"}


@tool_handler("tests.loop.slow_order")
def _slow_order(number: str) -> dict[str, Any]:
    time.sleep(0.4)
    return {"number": number}


@tool_handler("tests.loop.stuck")
def _stuck(n: int) -> dict[str, Any]:
    time.sleep(3)
    return {"n": n}


def _tool(
    name: str,
    handler: str,
    properties: dict[str, Any],
    required: list[str] | None = None,
    **fields: Any,
) -> None:
    fields.setdefault("roles", ["support"])
    ToolFactory(
        name=name,
        handler=handler,
        parameters={
            "type": "object",
            "properties": properties,
            "required": required if required is not None else list(properties),
            "additionalProperties": False,
        },
        **fields,
    )


def _run(session: Session) -> Session:
    started = time.monotonic()
    result = runner.session_run(session_id=session.pk)
    assert result.stopped == "idle", result
    assert time.monotonic() - started < 20
    return Session.objects.get(pk=session.pk)


def _answer(session: Session) -> str:
    return str(
        Message.objects.filter(session=session, role="assistant")
        .order_by("-seq")
        .values_list("content", flat=True)
        .first()
    )


def _turn_finished(session: Session) -> dict[str, Any]:
    event = Event.objects.filter(session=session, type="turn.finished").order_by("-seq").first()
    assert event is not None
    return dict(event.data)


def _tool_names(request: Recorded) -> list[str]:
    return [t["function"]["name"] for t in request.body.get("tools", [])]


def _calls(session: Session) -> list[ToolCall]:
    return list(ToolCall.objects.filter(session=session).order_by("step", "position"))


# feedback and correction ----------------------------------------------------------------------


def test_the_model_fixes_bad_arguments_from_the_feedback_and_answers(
    make_agent, make_session, openai_server
):
    _tool(
        "count_orders", "tests.loop.count_orders",
        {"days": {"type": "integer", "minimum": 1}, "status": {"enum": ["exception", "ok"]}}, required=["days"],
    )  # fmt: skip
    session = make_session(make_agent(tools=["count_orders"]))
    openai_server.script(
        Reply(
            calls=[
                Call(
                    "count_orders",
                    {"days": "seven", "status": "late", "colour": "red"},
                    id="call_1",
                )
            ]
        ),
        Reply(calls=[Call("count_orders", {"days": "7", "status": "exception"}, id="call_2")]),
        Reply(text="There were 3 orders with exceptions in the last 7 days."),
    )
    message_post(session=session, content="How many orders had delivery exceptions this week?")

    session = _run(session)

    first, second, third = openai_server.requests
    assert _tool_names(first) == ["count_orders"]
    assert first.body["tools"][0]["function"]["parameters"]["required"] == ["days"]
    # The model is told exactly what to fix, every field at once.
    assert second.last_tool_result() == (
        f"{FAILURE_MARKER} (status: failed): invalid arguments for count_orders: "
        "unexpected field(s) colour in arguments; allowed: days, status; "
        'days must be an integer; got "seven"; '
        'status must be one of "exception", "ok"; got "late". Fix them and call again.'
    )
    # The result, then the platform's note that the call did not succeed.
    assert second.messages[-2]["tool_call_id"] == "call_1"
    assert second.messages[-1]["role"] == "system"
    assert "1 of 1 count_orders call did NOT succeed" in second.messages[-1]["content"]
    # The corrected call ran once, its "7" coerced, and its result came back as compact text.
    assert third.last_tool_result() == "count: 3, days: 7, status: exception"
    assert RAN["count_orders"] == 1
    failed, succeeded = _calls(session)
    assert (failed.status, failed.attempts, failed.output, failed.coercions) == (
        "failed",
        0,
        None,
        [],
    )
    assert (succeeded.status, succeeded.attempts, succeeded.coercions) == (
        "success",
        1,
        ['days: "7" -> 7'],
    )
    assert succeeded.output == {"count": 3, "days": 7, "status": "exception"}  # stored whole
    assert session.state == "finished"
    assert _answer(session) == "There were 3 orders with exceptions in the last 7 days."
    assert _turn_finished(session)["stop_reason"] == "answer"
    finished = [
        e.data for e in Event.objects.filter(session=session, type="tool.finished").order_by("seq")
    ]
    assert [(e["status"], e["coercions"]) for e in finished] == [
        ("failed", []),
        ("success", ['days: "7" -> 7']),
    ]


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        (
            "[7]",
            "arguments are not valid JSON (expected a JSON object, got list); send a JSON object.",
        ),
        ('{"days": 7', "arguments are not valid JSON ("),
        (
            {"days": 1, "status": "x" * (MAX_ARGUMENT_BYTES + 10)},
            f"the limit is {MAX_ARGUMENT_BYTES}. Send less data.",
        ),
    ],
    ids=["not-an-object", "broken-json", "huge"],
)
def test_unusable_arguments_are_refused_with_a_precise_message_and_nothing_runs(
    make_agent, make_session, openai_server, arguments, expected
):
    _tool(
        "count_orders",
        "tests.loop.count_orders",
        {"days": {"type": "integer"}, "status": {"type": "string"}},
        required=["days"],
    )
    session = make_session(make_agent(tools=["count_orders"]))
    openai_server.script(
        Reply(calls=[Call("count_orders", arguments, id="call_1")]),
        Reply(text="Sorry, I could not run the count."),
    )
    message_post(session=session, content="count")

    session = _run(session)

    feedback = openai_server.requests[1].last_tool_result()
    assert feedback.startswith(f"{FAILURE_MARKER} (status: failed): ")
    assert expected in feedback
    assert RAN["count_orders"] == 0
    assert _calls(session)[0].status == "failed"
    assert session.state == "finished"


# role gating ----------------------------------------------------------------------------------


def test_a_hidden_tool_is_not_offered_and_if_named_is_refused_like_an_unknown_one(
    make_agent, make_session, openai_server
):
    _tool("count_orders", "tests.loop.count_orders", {"days": {"type": "integer"}})
    _tool("wipe_orders", "tests.loop.wipe", {}, roles=["admin"])
    session = make_session(make_agent(tools=["count_orders", "wipe_orders"]), role="support")
    openai_server.strict = False  # a model that names tools it was not offered
    openai_server.script(
        Reply(calls=[Call("wipe_orders", {}, id="call_1")]),
        Reply(calls=[Call("teleport_orders", {}, id="call_2")]),
        Reply(text="I am not allowed to do that."),
    )
    message_post(session=session, content="wipe every order")

    session = _run(session)

    first, second, third = openai_server.requests
    assert _tool_names(first) == ["count_orders"]  # the admin tool is never shown
    hidden, unknown = second.last_tool_result(), third.last_tool_result()
    assert (
        hidden
        == f"{FAILURE_MARKER} (status: rejected): unknown tool 'wipe_orders'. Tools you may use: count_orders."
    )
    assert hidden == unknown.replace("teleport_orders", "wipe_orders")
    assert RAN["wipe"] == 0  # never executed
    assert [c.status for c in _calls(session)] == ["rejected", "rejected"]
    assert session.state == "finished" and _answer(session) == "I am not allowed to do that."


@pytest.mark.parametrize(
    ("name", "shown"),
    [
        ("functions.count_orders", '"functions.count_orders"'),
        ("rm -rf / ; count_orders", '"rm -rf / ; count_orders"'),
        pytest.param(
            "count_orders_" + "x" * 150,
            '"count_orders_' + "x" * 51 + '\\u2026"',
            id="longer-than-the-column",
        ),
    ],
)
def test_a_tool_name_with_odd_characters_is_refused_and_changes_nothing(
    make_agent, make_session, openai_server, name, shown
):
    _tool("count_orders", "tests.loop.count_orders", {"days": {"type": "integer"}})
    session = make_session(make_agent(tools=["count_orders"]))
    openai_server.strict = False  # a model that names a tool it was not offered
    openai_server.script(Reply(calls=[Call(name, {"days": 7})]), Reply(text="I could not count."))
    message_post(session=session, content="count")

    session = _run(session)

    assert openai_server.requests[1].last_tool_result() == (
        f"{FAILURE_MARKER} (status: rejected): unknown tool {shown}. Tools you may use: count_orders."
    )
    assert RAN["count_orders"] == 0
    assert session.state == "finished" and _answer(session) == "I could not count."


# concurrency ----------------------------------------------------------------------------------


def test_calls_from_one_response_run_concurrently_and_come_back_in_the_models_order(
    make_agent, make_session, openai_server
):
    # Three tools that each wait for the other two (MEETING): they can only all succeed
    # by running at the same time. (Not a wall-clock bound: on a slow shared machine a
    # bound of "less than two 200 ms naps" failed with the calls still concurrent.)
    names = ["meet_orders", "meet_customers", "meet_carriers"]
    for name in names:
        _tool(name, "tests.loop.meet", {"n": {"type": "integer"}})
    session = make_session(make_agent(tools=names))
    openai_server.script(
        Reply(calls=[Call(name, {"n": n}, id=f"call_{n}") for n, name in enumerate(names)]),
        Reply(text="All three checks are done."),
    )
    message_post(session=session, content="run the three checks")

    session = _run(session)

    calls = _calls(session)
    assert [c.tool_name for c in calls] == names
    # All three met: each was running while the other two were.
    assert [c.status for c in calls] == ["success"] * 3, [(c.status, c.error) for c in calls]
    assert MEETING.n_waiting == 0 and not MEETING.broken
    # Results in the model's order, each answering its own call.
    assert openai_server.requests[1].tool_results() == ["n: 0", "n: 1", "n: 2"]
    assert [
        m["tool_call_id"] for m in openai_server.requests[1].messages if m["role"] == "tool"
    ] == ["call_0", "call_1", "call_2"]
    assert session.state == "finished" and _answer(session) == "All three checks are done."


# loop guards: each stops the loop, and the user gets a summary answer ----------------------------


def _assert_stopped_with_a_summary(
    session: Session, server: FakeModelServer, stop_reason: str, note: str, answer: str
) -> None:
    *working, final = server.requests
    assert all(_tool_names(r) for r in working)
    assert (
        "tools" not in final.body and "tool_choice" not in final.body
    )  # asked once more, without tools
    last = final.messages[-1]
    assert last["role"] == "system"
    assert note in last["content"] and last["content"].endswith(FINAL_INSTRUCTION)
    assert session.state == "finished"
    assert _answer(session) == answer
    assert _turn_finished(session)["stop_reason"] == stop_reason
    move = Transition.objects.filter(session=session).order_by("-id").first()
    assert (move.from_state, move.trigger, move.to_state) == (
        "processing",
        "limit_reached",
        "finished",
    )
    assert server.pending == 0


def test_max_iterations_stops_the_loop_with_a_summary(make_agent, make_session, openai_server):
    _tool("get_order", "tests.loop.get_order", {"number": {"type": "string"}})
    session = make_session(make_agent(tools=["get_order"], max_iterations=3))
    openai_server.script(
        *[
            Reply(calls=[Call("get_order", {"number": f"SO-100{n}"}, id=f"call_{n}")])
            for n in range(1, 4)
        ],
        Reply(text="So far: SO-1001, SO-1002 and SO-1003 all have exceptions."),
    )
    message_post(session=session, content="check every order")

    session = _run(session)

    assert (
        RAN["get_order"] == 3
    )  # three different orders looked up one by one: progress, not a loop
    _assert_stopped_with_a_summary(
        session,
        openai_server,
        "max_iterations",
        LIMIT_NOTE,
        "So far: SO-1001, SO-1002 and SO-1003 all have exceptions.",
    )


def test_a_repeated_call_stops_the_loop_with_a_summary(make_agent, make_session, openai_server):
    _tool("search", "tests.loop.search", {"query": {"type": "string"}})
    session = make_session(make_agent(tools=["search"]))
    openai_server.script(
        Reply(calls=[Call("search", {"query": "red shoes size 42"}, id="call_1")]),
        Reply(calls=[Call("search", {"query": "red shoes, size 42"}, id="call_2")]),
        Reply(calls=[Call("search", {"query": "red shoes size 42"}, id="call_3")]),
        Reply(text="I found red shoes in size 42 (17 hits)."),
    )
    message_post(session=session, content="find red shoes")

    session = _run(session)

    _assert_stopped_with_a_summary(
        session,
        openai_server,
        "repeated_call",
        "You called search 3 times in a row",
        "I found red shoes in size 42 (17 hits).",
    )


def test_no_new_information_stops_the_loop_with_a_summary(make_agent, make_session, openai_server):
    _tool("search", "tests.loop.search_nothing", {"query": {"type": "string"}})
    session = make_session(make_agent(tools=["search"], max_iterations=8))
    queries = ["red shoes", "crimson sneakers in size 42", "scarlet trainers for running"]
    openai_server.script(
        *[
            Reply(calls=[Call("search", {"query": q}, id=f"call_{i}")])
            for i, q in enumerate(queries)
        ],
        Reply(text="Nothing matches; the catalogue has no such shoes."),
    )
    message_post(session=session, content="find red shoes")

    session = _run(session)

    assert RAN["search_nothing"] == 3
    _assert_stopped_with_a_summary(
        session, openai_server, "no_new_information", "The last 3 results of search were identical",
        "Nothing matches; the catalogue has no such shoes.",
    )  # fmt: skip


def test_a_cycle_stops_the_loop_with_a_summary(make_agent, make_session, openai_server):
    _tool("get_order", "tests.loop.get_order", {"number": {"type": "string"}})
    _tool("get_customer", "tests.loop.get_customer", {"customer_id": {"type": "integer"}})
    session = make_session(make_agent(tools=["get_order", "get_customer"]))
    order = Reply(calls=[Call("get_order", {"number": "SO-1001"})])
    customer = Reply(calls=[Call("get_customer", {"customer_id": 17})])
    openai_server.script(
        order, customer, order, customer, Reply(text="SO-1001 belongs to Ada Lovelace.")
    )
    message_post(session=session, content="whose order is SO-1001?")

    session = _run(session)

    _assert_stopped_with_a_summary(
        session,
        openai_server,
        "cycle",
        "going round in a cycle (get_order -> get_customer)",
        "SO-1001 belongs to Ada Lovelace.",
    )
    assert (RAN["get_order"], RAN["get_customer"]) == (
        1,
        1,
    )  # the repeats were answered from the cache


def test_the_guard_limits_are_per_agent(make_agent, make_session, openai_server):
    _tool("search", "tests.loop.search", {"query": {"type": "string"}})
    session = make_session(make_agent(tools=["search"], repeat_call_limit=2))
    openai_server.script(
        Reply(calls=[Call("search", {"query": "red shoes"})]),
        Reply(calls=[Call("search", {"query": "red shoes"})]),
        Reply(text="Red shoes: 9 hits."),
    )
    message_post(session=session, content="find red shoes")

    session = _run(session)

    _assert_stopped_with_a_summary(
        session,
        openai_server,
        "repeated_call",
        "You called search 2 times in a row",
        "Red shoes: 9 hits.",
    )


# time limits ------------------------------------------------------------------------------------


def test_the_turn_time_limit_stops_tool_rounds_and_asks_for_an_answer(
    make_agent, make_session, openai_server
):
    _tool("slow_order", "tests.loop.slow_order", {"number": {"type": "string"}})
    session = make_session(make_agent(tools=["slow_order"], turn_timeout_s=0.3))
    openai_server.script(
        Reply(calls=[Call("slow_order", {"number": "SO-1001"})]),
        Reply(text="SO-1001 exists; I ran out of time for more checks."),
    )
    message_post(session=session, content="check SO-1001 thoroughly")

    session = _run(session)

    assert len(openai_server.requests) == 2
    _assert_stopped_with_a_summary(
        session,
        openai_server,
        "turn_timeout",
        "past its limit of 0.3 s",
        "SO-1001 exists; I ran out of time for more checks.",
    )


def test_the_step_time_limit_reports_running_calls_as_timeouts(
    make_agent, make_session, openai_server
):
    _tool("stuck", "tests.loop.stuck", {"n": {"type": "integer"}}, timeout_s=10)
    _tool("nap", "tests.loop.nap", {"n": {"type": "integer"}})
    session = make_session(make_agent(tools=["stuck", "nap"], step_timeout_s=0.5))
    openai_server.script(
        Reply(calls=[Call("stuck", {"n": 1}), Call("nap", {"n": 2})]),
        Reply(text="One check finished, the other took too long."),
    )
    message_post(session=session, content="run both")

    started = time.monotonic()
    session = _run(session)

    assert time.monotonic() - started < 2.5
    stuck, nap = _calls(session)
    assert (stuck.status, nap.status) == ("timeout", "success")
    assert openai_server.requests[1].tool_results() == [
        f"{FAILURE_MARKER} (status: timeout): stuck was stopped: the step's time limit of 0.5 s ran out.",
        "n: 2",
    ]
    assert session.state == "finished"


# the read-only cache ----------------------------------------------------------------------------


def test_an_identical_read_only_call_is_answered_from_the_cache(
    make_agent, make_session, openai_server
):
    _tool("get_order", "tests.loop.get_order", {"number": {"type": "string"}})
    session = make_session(make_agent(tools=["get_order"]))
    openai_server.script(
        Reply(calls=[Call("get_order", {"number": "SO-1001"})]),
        Reply(calls=[Call("get_order", {"number": "SO-1001"})]),
        Reply(text="SO-1001 has an exception."),
    )
    message_post(session=session, content="check SO-1001 twice")

    session = _run(session)

    first, second = _calls(session)
    assert RAN["get_order"] == 1
    assert (first.cached, second.cached) == (False, True)
    assert second.status == "success" and second.output == first.output
    marker, facts = openai_server.requests[2].last_tool_result().split("\n")
    assert marker == "(cached result from an identical earlier call)"
    # (jsonb keeps its own key order, so the stored copy's facts may come in another order)
    assert sorted(facts.split(", ")) == ["customer_id: 17", "number: SO-1001", "status: exception"]
    finished = [
        e.data["cached"]
        for e in Event.objects.filter(session=session, type="tool.finished").order_by("seq")
    ]
    assert finished == [False, True]


@tool_handler("tests.loop.notify", wants_idempotency_key=True)
def _notify(customer_id: int, idempotency_key: str) -> dict[str, Any]:
    RAN["notify"] += 1
    return {"ok": True, "customer_id": customer_id, "key": idempotency_key}


def test_a_side_effect_call_is_never_answered_from_the_cache(
    make_agent, make_session, openai_server
):
    _tool("notify", "tests.loop.notify", {"customer_id": {"type": "integer"}}, side_effects=True)
    session = make_session(make_agent(tools=["notify"]))
    openai_server.script(
        Reply(calls=[Call("notify", {"customer_id": 17})]),
        Reply(calls=[Call("notify", {"customer_id": 17})]),
        Reply(text="Customer 17 was notified twice, as asked."),
    )
    message_post(session=session, content="notify customer 17, then remind them")

    session = _run(session)

    first, second = _calls(session)
    assert RAN["notify"] == 2
    assert not first.cached and not second.cached
    assert (
        first.output["key"]
        == first.idempotency_key
        != second.idempotency_key
        == second.output["key"]
    )


# side effects exactly once: a tool step that runs again ------------------------------------------


class SimulatedCrash(Exception):
    """The worker died after the HTTP call went out, before the results were committed."""


def _coupon_tool(base_url: str, **fields: Any) -> None:
    ToolFactory(
        name="issue_coupon", kind="http", handler="", url=f"{base_url}/coupons", method="POST",
        side_effects=True, roles=["support"], timeout_s=5,
        parameters={
            "type": "object",
            "properties": {"customer_id": {"type": "integer"}, "amount": {"type": "number"}, "reason": {"type": "string"}},
            "required": ["customer_id", "amount"],
            "additionalProperties": False,
        },
        **fields,
    )  # fmt: skip


def _crash_once_after_the_tool_ran(
    session: Session, owner: str, monkeypatch: pytest.MonkeyPatch
) -> Session:
    """Run the model step (the intent commits), then a tool step that dies before its commit."""
    assert lease_acquire(session_id=session.pk, owner=owner, seconds=60)
    session = Session.objects.get(pk=session.pk)
    assert runner.run_step(session, owner)
    session = Session.objects.get(pk=session.pk)
    assert session.state == "tool_wait"

    def crash(*args: Any, **kwargs: Any) -> None:
        raise SimulatedCrash

    with monkeypatch.context() as patch:
        patch.setattr(tool_phase, "tool_results", crash)
        with pytest.raises(SimulatedCrash):
            tool_phase.tool_step(session, owner)
    session = Session.objects.get(pk=session.pk)
    assert session.state == "tool_wait"
    assert ToolCall.objects.get(session=session).status == "executing"
    return session


def _finish(session: Session, owner: str) -> Session:
    lease_drop(session_id=session.pk, owner=owner)
    return _run(session)


def test_a_re_executed_http_tool_step_sends_the_same_idempotency_key_and_issues_one_coupon(
    make_agent, make_session, openai_server, demo_api, monkeypatch
):
    demo_data_seed()
    customer = Coupon._meta.get_field("customer").related_model.objects.order_by("id").first()
    _coupon_tool(demo_api)  # no status URL: an uncertain call is sent again, with the same key
    session = make_session(make_agent(tools=["issue_coupon"]))
    openai_server.script(
        Reply(
            calls=[
                Call(
                    "issue_coupon",
                    {"customer_id": str(customer.pk), "amount": 10, "reason": "late parcel"},
                )
            ]
        ),
        Reply(text="Coupon issued."),
    )
    message_post(session=session, content=f"give customer {customer.pk} a coupon of 10")
    owner = "tests-tool-loop"

    session = _crash_once_after_the_tool_ran(session, owner, monkeypatch)
    assert Coupon.objects.count() == 1  # the first attempt took effect
    tool_phase.tool_step(session, owner)  # the step runs again
    session = _finish(session, owner)

    call = ToolCall.objects.get(session=session)
    posts = list(ApiRequestLog.objects.filter(method="POST", path="/coupons").order_by("id"))
    assert [p.idempotency_key for p in posts] == [call.idempotency_key, call.idempotency_key]
    assert [p.status for p in posts] == [201, 200]  # the second answer: the first coupon again
    coupon = Coupon.objects.get()
    assert (coupon.customer_id, coupon.amount, coupon.idempotency_key) == (
        customer.pk,
        10,
        call.idempotency_key,
    )
    assert call.status == "success"
    assert call.output["coupon_code"] == coupon.code and call.output["duplicate"] is True
    assert call.coercions == [f'customer_id: "{customer.pk}" -> {customer.pk}']
    assert session.state == "finished" and _answer(session) == "Coupon issued."


def test_a_re_executed_http_tool_step_with_a_status_url_asks_instead_of_sending_again(
    make_agent, make_session, openai_server, demo_api, monkeypatch
):
    demo_data_seed()
    customer = Coupon._meta.get_field("customer").related_model.objects.order_by("id").first()
    _coupon_tool(demo_api, status_url=f"{demo_api}/coupons/status")
    session = make_session(make_agent(tools=["issue_coupon"]))
    openai_server.script(
        Reply(calls=[Call("issue_coupon", {"customer_id": customer.pk, "amount": 15})]),
        Reply(text="Coupon issued."),
    )
    message_post(session=session, content=f"give customer {customer.pk} a coupon of 15")
    owner = "tests-tool-loop"

    session = _crash_once_after_the_tool_ran(session, owner, monkeypatch)
    tool_phase.tool_step(session, owner)
    session = _finish(session, owner)

    call = ToolCall.objects.get(session=session)
    seen = list(
        ApiRequestLog.objects.order_by("id").values_list("method", "path", "idempotency_key")
    )
    assert seen == [
        ("POST", "/coupons", call.idempotency_key),
        ("GET", "/coupons/status", call.idempotency_key),
    ]
    coupon = Coupon.objects.get()
    assert call.status == "success" and call.output["coupon_code"] == coupon.code
    assert (
        openai_server.requests[1]
        .last_tool_result()
        .startswith("ok: true, coupon_code: " + coupon.code)
    )
    assert session.state == "finished"


def test_a_refusal_from_the_business_api_is_a_failed_result_the_model_reads(
    make_agent, make_session, openai_server, demo_api
):
    demo_data_seed()
    _coupon_tool(demo_api)
    session = make_session(make_agent(tools=["issue_coupon"]))
    openai_server.script(
        Reply(calls=[Call("issue_coupon", {"customer_id": 999999, "amount": 10})]),
        Reply(text="That customer does not exist."),
    )
    message_post(session=session, content="coupon for customer 999999")

    session = _run(session)

    assert openai_server.requests[1].last_tool_result() == (
        f"{FAILURE_MARKER} (status: failed): issue_coupon refused the call: HTTP 404: customer 999999 not found"
    )
    call = ToolCall.objects.get(session=session)
    assert (call.status, call.output) == (
        "failed",
        {"ok": False, "error": "customer 999999 not found"},
    )
    assert Coupon.objects.count() == 0
    assert session.state == "finished" and _answer(session) == "That customer does not exist."


# retries whose wait is too long for a worker (runtime/retry.py, engine/phases/tools.py) ----


def _refund_tool(url: str) -> str:
    name = f"refund_{uuid.uuid4().hex[:6]}"
    ToolFactory(
        name=name, kind="http", handler="", url=url, method="POST", side_effects=True,
        roles=["support"], risk_level=1, timeout_s=5, retry={"attempts": 3},
        parameters={
            "type": "object",
            "properties": {"order": {"type": "string"}},
            "required": ["order"],
            "additionalProperties": False,
        },
    )  # fmt: skip
    return name


def test_a_long_retry_after_parks_the_session_and_the_call_goes_again_after_it(
    make_agent, make_session, openai_server
):
    """A 503 with Retry-After: 30 on a keyed side-effecting call: no worker waits 30 s;
    the session is parked (the call's attempts and due time committed, the lease dropped
    until then), a run woken early parks again without sending, and once due the same
    call goes again with the same key and the turn finishes."""
    with ScriptedApi() as api:
        api.script(
            Answer(503, {"error": "maintenance"}, headers={"Retry-After": "30"}),
            Answer(200, {"ok": True, "refunded": "A1"}),
        )
        name = _refund_tool(api.url("/refunds"))
        session = make_session(make_agent(tools=[name]))
        openai_server.script(Reply(calls=[Call(name, {"order": "A1"})]), Reply(text="Refunded."))
        message_post(session=session, content="refund A1")

        assert runner.session_run(session_id=session.pk).stopped == "deferred"
        call = ToolCall.objects.get(session=session)
        assert (call.status, call.attempts, call.dispatched_at) == ("executing", 1, None)
        assert call.retry_at is not None and call.retry_at > timezone.now() + timedelta(seconds=20)
        parked = Session.objects.get(pk=session.pk)
        assert parked.lease_owner is None and parked.lease_expires_at > timezone.now() + timedelta(
            seconds=20
        )
        assert runner.session_run(session_id=session.pk).stopped == "deferred"  # woken early
        assert len(api.requests) == 1

        ToolCall.objects.filter(pk=call.pk).update(retry_at=timezone.now() - timedelta(seconds=1))
        session = _run(session)
        seen = api.requests
    assert len(seen) == 2
    assert seen[0].headers["idempotency-key"] == seen[1].headers["idempotency-key"]
    call.refresh_from_db()
    assert (call.status, call.attempts) == ("success", 2)
    assert session.state == "finished" and _answer(session) == "Refunded."


def test_a_long_retry_is_not_parked_when_a_sibling_call_with_side_effects_ran(
    make_agent, make_session, openai_server
):
    """Parking would run the step again and lose the sibling's result: the failure goes
    to the model instead, saying when the call may work."""
    _tool("wipe_orders", "tests.loop.wipe", {}, side_effects=True, risk_level=1)
    with ScriptedApi(Answer(429, {"error": "slow down"}, headers={"Retry-After": "45"})) as api:
        name = _refund_tool(api.url("/refunds"))
        session = make_session(make_agent(tools=[name, "wipe_orders"]))
        openai_server.script(
            Reply(calls=[Call(name, {"order": "A1"}), Call("wipe_orders", {})]),
            Reply(text="The refund must wait."),
        )
        message_post(session=session, content="refund A1 and wipe")
        session = _run(session)
        assert len(api.requests) == 1
    assert RAN["wipe"] == 1
    refund = ToolCall.objects.get(session=session, tool_name=name)
    assert (refund.status, refund.attempts, refund.retry_at) == ("failed", 1, None)
    shown = Message.objects.get(session=session, role="tool", name=name).content
    assert shown.endswith("It may work if called again in 45 s.")
    assert session.state == "finished"
