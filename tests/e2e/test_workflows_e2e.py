"""Workflow runs on the real stack (daphne, a Celery worker, beat, on the test database):
a worker killed with SIGKILL in the middle of a map of side-effecting calls, a person's
review whose deadline passes while every process is down, `parallel` with `join: any`,
a cycle stopped by `max_visits`, bad input through the server, and the websocket of a run.

The business APIs the tools call are HTTP servers in this process (`RoutedApi`), so a test
sees every request the platform made, with its Idempotency-Key, and can hold a request
for as long as it needs a call to be under way.
"""

import asyncio
import json
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
import yaml
from django.utils import timezone

from approvals.models import Approval
from record.models import Message, Session, ToolCall
from tests.e2e.support import (
    Frame,
    api,
    collect_until,
    get_events,
    get_messages,
    get_session,
    persisted,
    stack_logs,
    turns_finished,
    wait_events,
    ws_connect,
)
from tests.factories import ModelEndpointFactory, ToolFactory, api_key_for
from tests.stack import Stack
from tests.tools.http_server import Answer, Drop, ScriptedApi, Seen
from workflows.selectors import definition_check
from workflows.services import workflow_apply

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


# Business APIs in this process ---------------------------------------------------------------


class RoutedApi(ScriptedApi):
    """A ScriptedApi whose answer is worked out from each request (`route`), not read from
    a script: it still records every request."""

    def __init__(self, route: Callable[[Seen], Answer | Drop]) -> None:
        super().__init__()
        self.route = route

    def next(self, seen: Seen) -> Answer | Drop:
        super().next(seen)  # recorded
        return self.route(seen)


class NoticeApi:
    """A notification service that honours Idempotency-Key, slowly.

    `POST /notices {"customer": n}` sends a notice (the effect, recorded as the request
    arrives, before the answer is delayed by `delay_s`); a repeated key answers the first
    notice and sends nothing. `GET /notices/status?idempotency_key=K` says whether a notice
    with that key was sent: what the platform probes after a crash.
    """

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.sent: dict[str, dict[str, Any]] = {}  # idempotency key -> the notice
        self._changed = threading.Condition()
        self.http = RoutedApi(self._route)

    @contextmanager
    def running(self) -> Iterator["NoticeApi"]:
        with self.http:
            yield self

    def _route(self, seen: Seen) -> Answer:
        if seen.method == "GET" and seen.path == "/notices/status":
            notice = self.sent.get(seen.query.get("idempotency_key", ""))
            if notice is None:
                return Answer(404, {"status": "unknown"})
            return Answer(200, {"status": "done", "result": notice})
        key = seen.headers.get("idempotency-key", "")
        with self._changed:
            notice = self.sent.get(key)
            if notice is None:
                notice = {
                    "ok": True,
                    "notice": len(self.sent) + 1,
                    "customer": seen.body["customer"],
                }
                self.sent[key] = notice
                self._changed.notify_all()
        return Answer(200, notice, delay_s=self.delay_s)

    def wait_sent(self, count: int, timeout: float, describe: Callable[[], str]) -> None:
        with self._changed:
            if not self._changed.wait_for(lambda: len(self.sent) >= count, timeout):
                raise AssertionError(f"{len(self.sent)} notices after {timeout} s\n{describe()}")

    def posts_by_key(self) -> Counter[str]:
        return Counter(
            r.headers.get("idempotency-key", "") for r in self.http.requests if r.method == "POST"
        )

    def probed_keys(self) -> list[str]:
        return [
            r.query.get("idempotency_key", "")
            for r in self.http.requests
            if r.method == "GET" and r.path == "/notices/status"
        ]


def _http_tool(name: str, url: str, properties: dict[str, Any], **fields: Any) -> None:
    ToolFactory(
        name=name,
        kind="http",
        handler="",
        url=url,
        method="POST",
        timeout_s=10,
        parameters={
            "type": "object",
            "properties": properties,
            "required": list(properties),
            "additionalProperties": False,
        },
        roles=["support"],
        **fields,
    )


# Workflows -----------------------------------------------------------------------------------


def _apply(text: str) -> str:
    """Store a workflow as apply_config does (the same checks); its slug."""
    ModelEndpointFactory(name="rules", api="rules", options={})
    raw = yaml.safe_load(text)
    definition = definition_check(raw, where=f"workflow {raw['slug']}")
    workflow_apply(definition=definition, where="test", default_model="rules")
    return str(raw["slug"])


def _start(client: httpx.Client, slug: str, value: dict[str, Any]) -> str:
    response = client.post(f"/api/v1/workflows/{slug}/runs/", json={"input": value})
    assert response.status_code == 201, response.text
    assert response.json()["workflow"] == slug
    return str(response.json()["id"])


def _wait_state(
    client: httpx.Client,
    session_id: str,
    state: str,
    timeout: float,
    describe: Callable[[], str] = lambda: "",
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        session = get_session(client, session_id)
        if session["state"] == state:
            return session
        if time.monotonic() > deadline:
            raise AssertionError(f"state {session['state']}, wanted {state}\n{describe()}")
        time.sleep(0.05)


def _gapless(events: list[Frame]) -> None:
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1)), [
        (e["seq"], e["type"]) for e in events
    ]


def _nodes(events: list[Frame]) -> list[tuple[str, str]]:
    return [(e["type"], e["data"]["node"]) for e in events if e["type"].startswith("node.")]


# 1. SIGKILL in the middle of a map -----------------------------------------------------------

NOTIFY_ALL = """
slug: notify-all
role: support
input:
  type: object
  properties: {customers: {type: array, items: {type: integer}}}
  required: [customers]
start: each
nodes:
  each:
    kind: map
    over: input.customers
    as: c
    concurrency: 2
    node: {kind: tool, tool: send_notice, args: {customer: c}}
    output: sent
    next: end
"""


def test_a_worker_killed_in_the_middle_of_a_map_leaves_every_notice_sent_exactly_once(
    live_stack: Stack,
) -> None:
    customers = [11, 12, 13, 14, 15, 16]
    logs = stack_logs(live_stack, "worker", "beat")
    with NoticeApi(delay_s=1.0).running() as notices:
        _http_tool(
            "send_notice",
            notices.http.url("/notices"),
            {"customer": {"type": "integer"}},
            side_effects=True,
            status_url=notices.http.url("/notices/status"),
        )
        _apply(NOTIFY_ALL)
        with api(live_stack, api_key_for("alice")) as client:
            run = _start(client, "notify-all", {"customers": customers})
            # Two at a time: the first two are answered, the next two are at the API, unanswered.
            notices.wait_sent(4, 20, logs)
            victim = live_stack.procs["worker"]
            row = Session.objects.get(pk=run)
            assert f":{victim.pid}:" in (row.lease_owner or ""), (row.lease_owner, victim.pid)
            try:
                live_stack.stop("worker", signal.SIGKILL)
                assert victim.poll() == -signal.SIGKILL
                in_flight = {
                    c.call_id: (c.status, c.dispatched_at is not None)
                    for c in ToolCall.objects.filter(session_id=run, status="executing")
                }
            finally:
                live_stack.restart("worker")
            events = wait_events(client, run, turns_finished(1), 40, logs)
            session = get_session(client, run)

    keys = {f"{run}:each.node#1[{i}]": customer for i, customer in enumerate(customers)}
    # The worker died while items 2 and 3 were sent and not yet answered.
    assert in_flight == {
        "each.node#1[2]": ("executing", True),
        "each.node#1[3]": ("executing", True),
    }
    # Every customer got exactly one notice, under its item's own key.
    assert Counter(n["customer"] for n in notices.sent.values()) == Counter(customers)
    assert {key: notice["customer"] for key, notice in notices.sent.items()} == keys
    # The next worker asked the API about the two it could not know about and sent nothing again.
    assert sorted(notices.probed_keys()) == [f"{run}:each.node#1[2]", f"{run}:each.node#1[3]"]
    assert notices.posts_by_key() == Counter(dict.fromkeys(keys, 1))
    calls = {c.call_id: c for c in ToolCall.objects.filter(session_id=run)}
    assert {c.status for c in calls.values()} == {"success"} and len(calls) == 6
    assert [calls[f"each.node#1[{i}]"].probe_outcome for i in range(6)] == [
        "", "", "done", "done", "", "",
    ]  # fmt: skip
    # The run finished once, with the results in the items' order.
    result = [notices.sent[key] for key in keys]
    assert [r["customer"] for r in session["workflow"]["result"]] == customers
    assert session["workflow"]["result"] == result and session["state"] == "finished"
    finished = [e for e in events if e["type"] == "turn.finished"]
    assert len(finished) == 1 and finished[0]["data"]["result"] == result
    assert finished[0]["data"]["stop_reason"] == "answer"
    assert _nodes(events) == [("node.started", "each"), ("node.finished", "each")]
    _gapless(events)


# 2. A review's deadline passes while everything is down ---------------------------------------

REVIEW = """
slug: SLUG
role: support
input: {type: object, properties: {order: {type: string}}, required: [order]}
start: review
result: answer
nodes:
  review:
    kind: human
    summary: "Refund on {{ input.order }}"
    timeout_s: 5
    on_timeout: POLICY
    output: decision
    next: refund
    rejected: decline
  refund: {kind: llm, prompt: "Say: refunded {{ input.order }}", output: answer, next: end}
  decline: {kind: llm, prompt: "Say: declined {{ input.order }}", output: answer, next: end}
rules:
  - {when: {user: "^Say: (.*)$"}, answer: "{{ match.1 }}"}
"""


def test_a_review_whose_deadline_passed_while_every_process_was_down_takes_its_policy(
    live_stack: Stack,
) -> None:
    for policy in ("reject", "approve"):
        _apply(REVIEW.replace("SLUG", f"review-{policy}").replace("POLICY", policy))
    key = api_key_for("alice")
    with api(live_stack, key) as client:
        runs = {
            "reject": _start(client, "review-reject", {"order": "SO-1"}),
            "approve": _start(client, "review-approve", {"order": "SO-2"}),
        }
        for run in runs.values():
            _wait_state(client, run, "awaiting_approval", 20, stack_logs(live_stack))

    names = ["beat", "worker", "web"]  # beat first: nothing schedules a sweep once it is gone
    for name in names:
        live_stack.stop(name, signal.SIGKILL)  # as a power cut: no process tidies up
    try:
        deadlines = dict(Approval.objects.filter(session_id__in=runs.values()).values_list("session_id", "deadline"))  # fmt: skip
        assert len(deadlines) == 2
        assert min(deadlines.values()) > timezone.now(), (
            "stopping took longer than the review's timeout"
        )
        wait = (max(deadlines.values()) - timezone.now()).total_seconds() + 0.5
        time.sleep(wait)  # past both deadlines, with no process of the platform running
        assert set(Approval.objects.filter(session_id__in=runs.values()).values_list("status", flat=True)) == {"pending"}  # fmt: skip
    finally:
        for name in reversed(names):
            live_stack.restart(name)
        live_stack.wait_ready(60)

    with api(live_stack, key) as client:
        events = {
            policy: wait_events(client, run, turns_finished(1), 30, stack_logs(live_stack, "beat", "worker"))
            for policy, run in runs.items()
        }  # fmt: skip
        sessions = {policy: get_session(client, run) for policy, run in runs.items()}

    approvals = {
        str(a.session_id): a for a in Approval.objects.filter(session_id__in=runs.values())
    }
    rejected, approved = approvals[runs["reject"]], approvals[runs["approve"]]
    assert (rejected.status, rejected.decided_by_name) == ("expired", "system")
    assert (approved.status, approved.decided_by_name) == ("approved", "system")
    for approval in (rejected, approved):
        assert approval.decided_at is not None and approval.decided_at > approval.deadline

    # on_timeout: reject takes the `rejected` edge; approve the `next` one.
    assert sessions["reject"]["workflow"]["result"] == "declined SO-1"
    assert sessions["approve"]["workflow"]["result"] == "refunded SO-2"
    for policy, next_node in (("reject", "decline"), ("approve", "refund")):
        assert sessions[policy]["state"] == "finished"
        assert _nodes(events[policy]) == [
            ("node.started", "review"),
            ("node.finished", "review"),
            ("node.started", next_node),
            ("node.finished", next_node),
        ]
        review = next(e for e in events[policy] if e["type"] == "node.finished")
        assert review["data"]["next"] == next_node
        assert review["data"]["output"]["approved"] is (policy == "approve")
        assert events[policy][-1]["type"] == "turn.finished"
        assert events[policy][-1]["data"]["stop_reason"] == "answer"
        _gapless(events[policy])
    resolved = next(e for e in events["reject"] if e["type"] == "approval.resolved")
    assert resolved["data"]["outcome"] == "expired"


# 3. parallel, join: any -------------------------------------------------------------------------

RACE = """
slug: quote-race
role: support
input:
  type: object
  properties: {sku: {type: string}, patience: {type: integer}}
  required: [sku, patience]
start: ask
nodes:
  ask:
    kind: parallel
    join: any
    branches:
      fast: {kind: tool, tool: quote_fast, args: {sku: input.sku}}
      slow: {kind: tool, tool: quote_slow, args: {sku: input.sku}}
      timeout: {kind: wait, seconds: input.patience}
    output: quote
    next: end
"""


def _quote(seen: Seen) -> Answer:
    who = seen.path.strip("/")
    if seen.body["sku"] == "GONE":
        return Answer(409, {"ok": False, "error": "GONE is discontinued"})
    return Answer(200, {"sku": seen.body["sku"], "price": 10 if who == "fast" else 9, "by": who},
                  delay_s=0.2 if who == "fast" else 1.5)  # fmt: skip


def test_parallel_any_takes_the_first_branch_to_finish_and_cancels_the_others(
    live_stack: Stack,
) -> None:
    with RoutedApi(_quote) as quotes:
        for who in ("fast", "slow"):
            _http_tool(f"quote_{who}", quotes.url(f"/{who}"), {"sku": {"type": "string"}})
        _apply(RACE)
        with api(live_stack, api_key_for("alice")) as client:
            started = time.monotonic()
            quick = _start(client, "quote-race", {"sku": "MUG-1", "patience": 30})
            timed_out = _start(client, "quote-race", {"sku": "GONE", "patience": 1})
            events = wait_events(client, quick, turns_finished(1), 20, stack_logs(live_stack))
            took = time.monotonic() - started
            late = wait_events(client, timed_out, turns_finished(1), 20, stack_logs(live_stack))
            sessions = {run: get_session(client, run) for run in (quick, timed_out)}

    # The quick quote won without waiting out the 30 s timer; only its branch is in the output.
    assert took < 10, took
    quote = {"sku": "MUG-1", "price": 10, "by": "fast"}
    assert sessions[quick]["workflow"]["result"] == {"fast": quote}
    assert events[-1]["type"] == "turn.finished" and events[-1]["data"]["result"] == {"fast": quote}
    status = (Session.objects.get(pk=quick).workflow_state or {})["status"]
    assert (status["ask.slow"], status["ask.timeout"]) == ("cancelled", "cancelled")
    assert _nodes(events) == [("node.started", "ask"), ("node.finished", "ask")]
    # Both quotes were asked in the same step (a step's calls run side by side); the slow one
    # answered too, after the fast one, and is not in the output. No timer was set.
    calls = dict(ToolCall.objects.filter(session_id=quick).values_list("tool_name", "status"))
    assert calls == {"quote_fast": "success", "quote_slow": "success"}
    assert Session.objects.get(pk=quick).timer_due_at is None

    # Both quotes refused: nothing could finish before the timer, which then won.
    assert sessions[timed_out]["workflow"]["result"] == {"timeout": None}
    assert late[-1]["data"]["stop_reason"] == "answer"
    calls = dict(ToolCall.objects.filter(session_id=timed_out).values_list("tool_name", "status"))
    assert calls == {"quote_fast": "failed", "quote_slow": "failed", "workflow.wait": "success"}
    assert "waiting_timer" in [e["data"]["to"] for e in late if e["type"] == "state.changed"], [
        (e["type"], e["data"]) for e in late
    ]


# 3b. A map whose items finish out of order ---------------------------------------------------

PROBE_ALL = """
slug: probe-all
role: support
input:
  type: object
  properties: {items: {type: array, items: {type: string}}}
  required: [items]
start: each
nodes:
  each:
    kind: map
    over: input.items
    as: it
    concurrency: 3
    node:
      kind: tool
      tool: probe
      args: {item: it}
      retry: {max_attempts: 3, backoff_s: 1}
    output: found
    next: end
"""


class ProbeApi:
    """A service whose first answer for `first` is lost (the connection drops), so the map
    tries that item again after a pause; `second` and `third` answer at once."""

    def __init__(self) -> None:
        self.asked: Counter[str] = Counter()
        self.http = RoutedApi(self._route)

    def _route(self, seen: Seen) -> Answer | Drop:
        item = seen.body["item"]
        self.asked[item] += 1
        if item == "first" and self.asked[item] == 1:
            return Drop()
        return Answer(200, {"item": item, "probed": True})


def test_a_maps_items_that_finish_out_of_order_give_results_in_item_order(
    live_stack: Stack,
) -> None:
    """The first item's call is lost and tried again after a pause: the second and third
    items finish first, in an earlier step; the output still lists first, second, third."""
    items = ["first", "second", "third"]
    probes = ProbeApi()
    with probes.http:
        # No retry inside the call: the map node's own retry (a durable pause) tries it again.
        _http_tool(
            "probe", probes.http.url("/probe"), {"item": {"type": "string"}},
            retry={"attempts": 1},
        )  # fmt: skip
        _apply(PROBE_ALL)
        with api(live_stack, api_key_for("alice")) as client:
            run = _start(client, "probe-all", {"items": items})
            events = wait_events(client, run, turns_finished(1), 40, stack_logs(live_stack))
            session = get_session(client, run)

    # The items finished out of order: second and third in one step, first later, on its retry.
    done = ToolCall.objects.filter(session_id=run, tool_name="probe", status="success")
    ended = [c.input["item"] for c in done.order_by("finished_at")]
    assert ended[-1] == "first" and sorted(ended[:2]) == ["second", "third"], ended
    assert probes.asked == Counter({"first": 2, "second": 1, "third": 1})
    # The output is in the items' order all the same.
    expected = [{"item": item, "probed": True} for item in items]
    assert session["state"] == "finished", session
    assert session["workflow"]["result"] == expected
    finished = [e for e in events if e["type"] == "turn.finished"]
    assert len(finished) == 1 and finished[0]["data"]["result"] == expected
    _gapless(events)


# 4. A cycle stopped by max_visits --------------------------------------------------------------

POLL = """
slug: poll-forever
role: support
start: poll
nodes:
  poll: {kind: tool, tool: clock, args: {}, output: now, next: again, max_visits: 3}
  again:
    kind: condition
    cases: [{when: "now.now != ''", next: poll}]
    default: end
"""


def test_a_cycle_is_stopped_by_max_visits_and_the_websocket_says_where(live_stack: Stack) -> None:
    ToolFactory(name="clock", handler="builtin.current_time", roles=["support"])
    _apply(POLL)
    key = api_key_for("alice")
    with api(live_stack, key) as client:
        run = _start(client, "poll-forever", {})

        async def watch() -> list[Frame]:
            async with ws_connect(live_stack, run, key) as ws:
                return await collect_until(
                    ws, lambda f, _: f["type"] == "turn.finished", 20, stack_logs(live_stack)
                )

        frames = asyncio.run(watch())
        events = get_events(client, run)
        session = get_session(client, run)

    assert [(f["seq"], f["type"], f["data"]) for f in persisted(frames)] == [
        (e["seq"], e["type"], e["data"]) for e in events
    ]
    assert _nodes(events) == [
        *[("node.started", "poll"), ("node.finished", "poll"), ("node.started", "again"), ("node.finished", "again")] * 3,
        ("node.failed", "poll"),
    ]  # fmt: skip
    visits = [e["data"]["visit"] for e in events if e["type"] == "node.started" and e["data"]["node"] == "poll"]  # fmt: skip
    assert visits == [1, 2, 3]
    failed = next(e["data"] for e in events if e["type"] == "node.failed")
    assert failed["error"].startswith("max_visits: node poll would run a 4th time")
    last = events[-1]
    assert last["type"] == "turn.finished" and last["data"]["stop_reason"] == "error"
    assert "max_visits" in last["data"]["reason"]
    assert session["state"] == "error"
    assert session["workflow"]["error"] == {"node": "poll", "message": failed["error"]}
    assert session["workflow"]["result"] is None
    assert ToolCall.objects.filter(session_id=run).count() == 3


# 5. Bad input through the server --------------------------------------------------------------

ORDERS = """
slug: orders-check
role: support
input:
  type: object
  properties:
    customers:
      type: array
      items: {type: object, properties: {id: {type: integer}}, required: [id]}
  required: [customers]
start: pick
nodes:
  pick: {kind: condition, cases: [{when: "size(input.customers) > 0", next: end}], default: end}
"""


def test_bad_input_is_refused_with_the_failing_path_and_starts_nothing(live_stack: Stack) -> None:
    _apply(ORDERS)
    with api(live_stack, api_key_for("alice")) as client:
        url = "/api/v1/workflows/orders-check/runs/"
        answers = {
            "$.input.customers[1].id": client.post(url, json={"input": {"customers": [{"id": 1}, {"id": "two"}]}}),
            "$.input": client.post(url, json={"input": {"people": []}}),
            "$.input.customers": client.post(url, json={"input": {"customers": "all"}}),
        }  # fmt: skip
        not_an_object = client.post(url, json={"input": ["customers"]})
        good = client.post(url, json={"input": {"customers": [{"id": 1}]}})

    for path, answer in answers.items():
        assert answer.status_code == 400, answer.text
        error = answer.json()["error"]
        assert error["code"] == "invalid_input", error
        assert error["details"]["path"] == path, error
        assert error["message"].startswith(f"{path}: "), error
    assert "'two' is not of type 'integer'" in answers["$.input.customers[1].id"].text
    assert "'customers' is a required property" in answers["$.input"].text
    assert not_an_object.status_code == 400
    assert not_an_object.json()["error"]["details"]["path"] == "$.input"
    assert good.status_code == 201, good.text
    # Only the good one made a run.
    assert [str(pk) for pk in Session.objects.values_list("pk", flat=True)] == [good.json()["id"]]


# 6. The websocket of a run ------------------------------------------------------------------------

QUOTE = """
slug: quote
role: support
input: {type: object, properties: {sku: {type: string}}, required: [sku]}
start: price
result: answer
nodes:
  price: {kind: tool, tool: price_of, args: {sku: input.sku}, output: priced, next: tell}
  tell: {kind: llm, prompt: "Say: {{ input.sku }} costs {{ priced.price }}", output: answer, next: end}
rules:
  - {when: {user: "^Say: (.*)$"}, answer: "{{ match.1 }}"}
"""


def test_a_run_streams_its_nodes_and_result_and_refuses_a_user_message(live_stack: Stack) -> None:
    prices = RoutedApi(
        lambda seen: Answer(200, {"sku": seen.body["sku"], "price": 42}, delay_s=1.0)
    )
    with prices:
        _http_tool("price_of", prices.url("/price"), {"sku": {"type": "string"}})
        _apply(QUOTE)
        key = api_key_for("alice")
        with api(live_stack, key) as client:
            run = _start(client, "quote", {"sku": "MUG-1"})

            async def scenario() -> list[Frame]:
                async with ws_connect(live_stack, run, key) as ws:
                    await ws.send(json.dumps({"type": "user_message", "content": "hurry up"}))
                    return await collect_until(
                        ws, lambda f, _: f["type"] == "turn.finished", 20, stack_logs(live_stack)
                    )

            frames = asyncio.run(scenario())
            rest = client.post(f"/api/v1/sessions/{run}/messages/", json={"content": "hello?"})
            events = get_events(client, run)
            messages = get_messages(client, run)

    errors = [f for f in frames if f["type"] == "error"]
    assert len(errors) == 1, frames
    refused = errors[0]
    assert refused["seq"] is None and refused["session"] == run
    assert refused["data"]["code"] == "not_a_conversation", refused
    assert "workflow run" in refused["data"]["message"]
    # The socket stayed open: the run's frames went on coming after the refusal.
    kinds = [f["type"] for f in frames]
    assert kinds.index("error") < kinds.index("turn.finished")
    assert [(f["type"], f["data"]["node"]) for f in frames if f["type"].startswith("node.")] == [
        ("node.started", "price"),
        ("node.finished", "price"),
        ("node.started", "tell"),
        ("node.finished", "tell"),
    ]
    price_done = next(f for f in frames if f["type"] == "node.finished")
    assert price_done["data"]["output"] == {"sku": "MUG-1", "price": 42}
    assert price_done["data"]["next"] == "tell"
    last = frames[-1]
    assert last["type"] == "turn.finished" and last["data"]["result"] == "MUG-1 costs 42"
    assert [(f["seq"], f["type"], f["data"]) for f in persisted(frames)] == [
        (e["seq"], e["type"], e["data"]) for e in events
    ]
    # REST refuses the same way; neither message was kept.
    assert rest.status_code == 409 and rest.json()["error"]["code"] == "not_a_conversation"
    assert [m["role"] for m in messages] == ["user", "tool", "assistant"], messages
    assert not Message.objects.filter(session_id=run, content__in=["hurry up", "hello?"]).exists()
    assert len(prices.requests) == 1


# 7. An expression too costly for its input ---------------------------------------------------

COSTLY = """
slug: costly
role: support
input: {type: object, properties: {items: {type: array}}}
start: check
nodes:
  check:
    kind: condition
    cases: [{when: "input.items.map(x, input.items.map(y, x + y)).size() > 0", next: end}]
    default: end
"""
QUICK = """
slug: quick
role: support
start: check
nodes:
  check: {kind: condition, cases: [{when: "true", next: end}], default: end}
"""


def test_an_expression_too_costly_for_its_input_fails_at_once_and_stalls_no_other_run(
    live_stack: Stack,
) -> None:
    _apply(COSTLY)
    _apply(QUICK)
    with api(live_stack, api_key_for("alice")) as client:
        # Unbounded, cel ran this for ~20 s here, holding the worker's GIL (and its
        # heartbeat), and then finished: it never ends in error.
        costly = _start(client, "costly", {"items": list(range(300))})
        quick = _start(client, "quick", {})
        _wait_state(client, quick, "finished", 20, stack_logs(live_stack))
        failed = _wait_state(client, costly, "error", 20, stack_logs(live_stack))
        events = get_events(client, costly)

    error = next(e["data"]["error"] for e in events if e["type"] == "node.failed")
    assert error.startswith(
        "expression_limit: workflow 'costly', node 'check', field 'cases[0].when'"
    )
    assert "expression_limit" in failed["last_error"]
