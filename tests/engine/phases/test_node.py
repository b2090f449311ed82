# ruff: noqa: F811 - pytest fixtures imported by name and used as parameters
"""Workflow runs in process (workflow_run_start + session_run, no worker): each node kind, the
graph's edges, retries, a person's review, timers, max_visits, deadlines, resume and fork.

`transaction=True`: tools run on helper threads with their own database connections.
"""

import threading
import time
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import yaml
from django.utils import timezone

from accounts.services import approver_grant
from approvals.models import Approval
from billing.models import BudgetHold, OwnerBudget
from engine import run_cache, session_run
from record.errors import Conflict
from record.models import Agent, Checkpoint, Event, ModelEndpoint, Session, ToolCall
from sessions.services import (
    approval_decide,
    approvals_expire_due,
    session_cancel,
    session_force_finish,
    session_fork,
    session_hand_back,
    session_operator_reply,
    session_resume,
    timers_fire_due,
)
from tests.event_order import assert_events_in_order
from tests.factories import AgentFactory, ModelEndpointFactory, ToolFactory, UserFactory
from tests.fakes.fixtures import openai_server, unique  # noqa: F401
from tests.fakes.model_servers import FakeModelServer, Reply
from tests.tools.conftest import fake_endpoint  # noqa: F401
from tools.registry import tool_handler
from workflows.selectors import definition_check
from workflows.services import workflow_apply, workflow_run_start

pytestmark = pytest.mark.django_db(transaction=True)

RAN: Counter[str] = Counter()
KEYS: list[str] = []
FLAKY: dict[str, int] = {}
_lock = threading.Lock()


@pytest.fixture(autouse=True)
def _forget() -> Iterator[None]:
    RAN.clear()
    KEYS.clear()
    FLAKY.clear()
    # Version ids come again after each test's truncation: no runtime kept from another test.
    run_cache._workflows.clear()
    yield
    # Every run of every test, at its end: node events nest and follow the path taken,
    # and turn.finished closes its turn (tests/event_order.py).
    assert_events_in_order()


@tool_handler("tests.node.lookup")
def _lookup(number: str) -> dict[str, Any]:
    with _lock:
        RAN["lookup"] += 1
    return {"number": number, "total": 60.5 if number.endswith("1") else 20, "customer_id": 7}


@tool_handler("tests.node.notify", wants_idempotency_key=True)
def _notify(customer: int, idempotency_key: str = "") -> dict[str, Any]:
    with _lock:
        RAN["notify"] += 1
        KEYS.append(idempotency_key)
    return {"sent_to": customer}


@tool_handler("tests.node.flaky", wants_idempotency_key=True)
def _flaky(n: int, idempotency_key: str = "") -> dict[str, Any]:
    with _lock:
        RAN["flaky"] += 1
        KEYS.append(idempotency_key)
        FLAKY[idempotency_key] = FLAKY.get(idempotency_key, 0) + 1
        if FLAKY[idempotency_key] == 1:
            raise ConnectionError("upstream reset")
    return {"n": n}


@tool_handler("tests.node.slow")
def _slow(seconds: float) -> dict[str, Any]:
    time.sleep(seconds)
    with _lock:
        RAN["slow"] += 1
    return {"slept": seconds}


@tool_handler("tests.node.refuse")
def _refuse(n: int) -> dict[str, Any]:
    with _lock:
        RAN["refuse"] += 1
    return {"ok": False, "error": f"order {n} is closed"}


def _tools() -> None:
    object_schema = {"type": "object", "additionalProperties": False}
    ToolFactory(
        name="lookup",
        handler="tests.node.lookup",
        parameters={
            **object_schema,
            "properties": {"number": {"type": "string"}},
            "required": ["number"],
        },
        roles=["support"],
    )
    ToolFactory(
        name="notify",
        handler="tests.node.notify",
        side_effects=True,
        parameters={**object_schema, "properties": {"customer": {"type": "integer"}}},
        roles=["support"],
    )
    ToolFactory(
        name="flaky",
        handler="tests.node.flaky",
        side_effects=True,
        parameters={**object_schema, "properties": {"n": {"type": "integer"}}},
    )
    ToolFactory(
        name="slow",
        handler="tests.node.slow",
        parameters={**object_schema, "properties": {"seconds": {"type": "number"}}},
    )
    ToolFactory(
        name="refuse",
        handler="tests.node.refuse",
        parameters={**object_schema, "properties": {"n": {"type": "integer"}}},
    )


@pytest.fixture
def owner() -> Any:
    ModelEndpointFactory()
    _tools()
    return UserFactory(username="wf-owner")


def _apply(text: str) -> str:
    raw = yaml.safe_load(text)
    definition = definition_check(raw, where=f"workflow {raw['slug']}")
    return workflow_apply(definition=definition, where="test", default_model="rules")


def _start(owner: Any, slug: str, value: dict[str, Any], **kwargs: Any) -> Session:
    session, created = workflow_run_start(
        owner=owner, key_roles=["support"], slug=slug, input=value, **kwargs
    )
    assert created
    return session


def _run(session: Session, stopped: str = "idle") -> Session:
    result = session_run(session_id=session.pk)
    assert result.stopped == stopped, result
    return Session.objects.get(pk=session.pk)


def _events(session: Session, prefix: str = "node.") -> list[tuple[str, dict[str, Any]]]:
    return [
        (e.type, e.data)
        for e in Event.objects.filter(session=session).order_by("seq")
        if e.type.startswith(prefix)
    ]


REFUND = """
slug: refund
role: support
input: {type: object, properties: {number: {type: string}}, required: [number]}
start: lookup
result: answer
nodes:
  lookup: {kind: tool, tool: lookup, args: {number: input.number}, output: order, next: check}
  check:
    kind: condition
    cases: [{when: "order.total > 50", next: review}]
    default: tell
  review:
    kind: human
    summary: "Refund {{ order.total }} on {{ input.number }}"
    timeout_s: 600
    on_timeout: approve
    output: decision
    next: notify
    rejected: tell_no
  notify: {kind: tool, tool: notify, args: {customer: order.customer_id}, output: sent, next: tell}
  tell: {kind: llm, prompt: "Tell: refund on {{ input.number }} done", output: answer, next: end}
  tell_no: {kind: llm, prompt: "Tell: refund on {{ input.number }} declined", output: answer, next: end}
rules:
  - {when: {user: "^Tell: (.*)$"}, answer: "Customer told: {{ match.1 }}"}
"""


def test_a_run_walks_tool_condition_and_llm_nodes_to_its_result(owner: Any) -> None:
    _apply(REFUND)
    session = _run(_start(owner, "refund", {"number": "SO-2"}))

    assert session.state == "finished"
    assert session.workflow_state["result"] == "Customer told: refund on SO-2 done"
    assert session.workflow_state["values"]["order"]["total"] == 20
    assert Counter(lookup=1) == RAN  # the small refund skipped the review and the notice
    kinds = [(t, d["node"]) for t, d in _events(session)]
    assert kinds == [
        ("node.started", "lookup"),
        ("node.finished", "lookup"),
        ("node.started", "check"),
        ("node.finished", "check"),
        ("node.started", "tell"),
        ("node.finished", "tell"),
    ]
    assert _events(session)[3][1]["next"] == "tell"
    finished = Event.objects.get(session=session, type="turn.finished").data
    assert finished["result"] == "Customer told: refund on SO-2 done"
    # Every node step left a checkpoint naming the nodes it settled, with the run's state.
    settled = [
        c.context["nodes"]
        for c in Checkpoint.objects.filter(session=session).order_by("step")
        if "workflow" in c.context
    ]
    assert ["lookup", "check", "tell"] in settled


def test_a_human_node_waits_in_the_approvers_queue_and_its_decision_picks_the_edge(
    owner: Any,
) -> None:
    _apply(REFUND)
    approver = UserFactory(username="wf-approver")
    approver_grant(username=approver.username, groups=["approvers"])
    session = _run(_start(owner, "refund", {"number": "SO-1"}))

    assert session.state == "awaiting_approval" and session.lease_owner is None
    approval = Approval.objects.get(session=session)
    assert approval.reason == "Refund 60.5 on SO-1"  # the node's summary
    assert approval.deadline > timezone.now() + timedelta(seconds=590)
    assert RAN["notify"] == 0

    approval_decide(approval_id=approval.pk, approve=False, user=approver, groups=["approvers"])
    session = _run(session)

    assert session.state == "finished"
    assert session.workflow_state["result"] == "Customer told: refund on SO-1 declined"
    assert session.workflow_state["values"]["decision"]["approved"] is False
    assert RAN["notify"] == 0


@pytest.mark.parametrize("approve", [True, False])
def test_a_review_call_lasts_from_the_cards_opening_to_its_result(
    owner: Any, approve: bool
) -> None:
    """Not the ~1 ms its tool takes to record the decision: the person's time is the call's."""
    _apply(REFUND)
    approver = UserFactory(username="wf-approver")
    approver_grant(username=approver.username, groups=["approvers"])
    session = _run(_start(owner, "refund", {"number": "SO-1"}))
    approval = Approval.objects.get(session=session)
    ToolCall.objects.filter(pk=approval.tool_call_id).update(
        created_at=timezone.now() - timedelta(seconds=90)
    )
    approval_decide(
        approval_id=approval.pk, approve=approve, user=approver, groups=["approvers"], comment="x"
    )
    _run(session)

    call = ToolCall.objects.get(pk=approval.tool_call_id)
    assert call.finished_at is not None and call.elapsed_ms >= 90_000


def test_a_review_whose_deadline_passes_takes_the_nodes_default_policy(owner: Any) -> None:
    _apply(REFUND)
    session = _run(_start(owner, "refund", {"number": "SO-1"}))
    Approval.objects.filter(session=session).update(deadline=timezone.now() - timedelta(seconds=1))

    approvals_expire_due()  # on_timeout: approve
    session = _run(session)

    assert session.state == "finished"
    assert session.workflow_state["values"]["decision"]["approved"] is True
    assert RAN["notify"] == 1 and [f"{session.pk}:notify#1"] == KEYS


FAN = """
slug: fan
role: support
input: {type: object, properties: {customers: {type: array, items: {type: integer}}}}
start: each
nodes:
  each:
    kind: map
    over: input.customers
    as: c
    concurrency: 2
    node: {kind: tool, tool: notify, args: {customer: c}}
    output: sent
    next: end
"""


def test_a_map_runs_its_items_at_most_concurrency_at_a_time_with_a_key_each(owner: Any) -> None:
    _apply(FAN)
    session = _run(_start(owner, "fan", {"customers": [5, 6, 7, 8, 9]}))

    assert session.state == "finished"
    assert session.workflow_state["result"] == [{"sent_to": c} for c in (5, 6, 7, 8, 9)]
    calls = list(ToolCall.objects.filter(session=session).order_by("id"))
    steps = Counter(c.step for c in calls)
    assert sorted(steps.values()) == [1, 2, 2]  # 2 + 2 + 1: never more than 2 in a step
    assert sorted(KEYS) == sorted(f"{session.pk}:each.node#1[{i}]" for i in range(5))
    assert RAN["notify"] == 5


@tool_handler("tests.node.first_fails", wants_idempotency_key=True)
def _first_fails(n: int, idempotency_key: str = "") -> dict[str, Any]:
    """Item 0's first attempt fails transiently; every other call succeeds."""
    with _lock:
        FLAKY[idempotency_key] = FLAKY.get(idempotency_key, 0) + 1
        if n == 0 and FLAKY[idempotency_key] == 1:
            raise ConnectionError("upstream reset")
    return {"n": n}


OUT_OF_ORDER = """
slug: out-of-order
role: support
input: {type: object, properties: {ns: {type: array, items: {type: integer}}}}
start: each
nodes:
  each:
    kind: map
    over: input.ns
    as: n
    concurrency: 3
    node: {kind: tool, tool: first_fails, args: {n: n}, retry: {max_attempts: 2, backoff_s: 0}}
    output: got
    next: end
"""


def test_a_maps_results_are_in_the_items_order_when_they_finish_out_of_order(
    owner: Any,
) -> None:
    # Items 1 and 2 finish at once; item 0 only after its retry's timer.
    ToolFactory(
        name="first_fails",
        handler="tests.node.first_fails",
        parameters={"type": "object", "properties": {"n": {"type": "integer"}}},
    )
    _apply(OUT_OF_ORDER)
    session = _run(_start(owner, "out-of-order", {"ns": [0, 1, 2]}))
    assert session.state == "waiting_timer"
    assert session.workflow_state["progress"]["each"]["results"].keys() == {"1", "2"}
    Session.objects.filter(pk=session.pk).update(timer_due_at=timezone.now())
    timers_fire_due()
    session = _run(session)

    assert session.state == "finished"
    assert session.workflow_state["result"] == [{"n": 0}, {"n": 1}, {"n": 2}]


LOOP = """
slug: loop
role: support
start: poll
nodes:
  poll: {kind: tool, tool: lookup, args: {number: "'SO-2'"}, output: order, next: again, max_visits: 3}
  again:
    kind: condition
    cases: [{when: "order.total < 100", next: poll}]
    default: end
"""


def test_a_cycle_is_stopped_by_max_visits(owner: Any) -> None:
    _apply(LOOP)
    session = _run(_start(owner, "loop", {}))

    assert session.state == "error"
    polls = list(ToolCall.objects.filter(session=session).order_by("id"))
    assert [c.call_id for c in polls] == ["poll#1", "poll#2", "poll#3"]
    # The same read-only call again: answered from the first (the tool ran once).
    assert [c.cached for c in polls] == [False, True, True] and RAN["lookup"] == 1
    failed = [d for t, d in _events(session) if t == "node.failed"]
    assert failed[0]["node"] == "poll" and "max_visits" in failed[0]["error"]
    assert session.workflow_state["error"]["node"] == "poll"
    assert "max_visits" in session.last_error


TWO_ASKS = """
slug: two-asks
role: support
start: first
result: second_said
nodes:
  first: {kind: llm, prompt: "Tell: one", output: first_said, next: second}
  second: {kind: llm, prompt: "Tell: two", output: second_said, next: end}
rules:
  - {when: {user: "^Tell: (.*)$"}, answer: "said {{ match.1 }}"}
"""


def test_two_model_nodes_of_one_step_hold_the_owners_budget_together(
    owner: Any, settings: Any
) -> None:
    """Both nodes call the model in one step, before it commits: the second one's hold adds
    to the first one's (its run's), so a day budget with room for one call stops it."""
    settings.BUDGET_OUTPUT_ESTIMATE_TOKENS = 100
    # A call holds 107 tokens (7 in, 100 out): the second finds 36 left, under 64.
    OwnerBudget.objects.create(owner=owner, day_tokens=150)
    _apply(TWO_ASKS)
    session = _run(_start(owner, "two-asks", {}))

    assert session.state == "error"
    assert session.workflow_state["values"]["first_said"] == "said one"
    failed = [d for t, d in _events(session) if t == "node.failed"]
    assert failed[0]["node"] == "second"
    assert failed[0]["error"].startswith(
        "budget_exceeded: the owner day budget does not cover another model call"
    )
    assert not BudgetHold.objects.exists()


RETRY = """
slug: retry
role: support
start: call
nodes:
  call: {kind: tool, tool: flaky, args: {n: 3}, output: got, next: end, retry: {max_attempts: 2, backoff_s: 0}}
"""


def test_a_transient_failure_is_tried_again_after_a_timer_with_the_same_key(owner: Any) -> None:
    _apply(RETRY)
    session = _run(_start(owner, "retry", {}))

    # The first attempt failed; the retry waits on a durable timer, no worker held.
    assert session.state == "waiting_timer" and RAN["flaky"] == 1
    Session.objects.filter(pk=session.pk).update(timer_due_at=timezone.now())
    timers_fire_due()
    session = _run(session)

    assert session.state == "finished"
    assert session.workflow_state["result"] == {"n": 3}
    assert RAN["flaky"] == 2 and len(set(KEYS)) == 1  # one logical call, one key
    call = ToolCall.objects.get(session=session, tool_name="flaky")
    assert call.status == "success"


def test_a_business_error_is_not_tried_again(owner: Any) -> None:
    _apply(RETRY.replace("flaky", "refuse").replace("slug: retry", "slug: refused"))
    session = _run(_start(owner, "refused", {}))

    assert session.state == "error"
    assert RAN["refuse"] == 1
    assert "order 3 is closed" in session.workflow_state["error"]["message"]
    # The failed call (run in the node step itself) counts as failed, as its tool.finished says.
    finished = Event.objects.get(session=session, type="turn.finished").data
    assert finished["calls"] == {"ok": 0, "failed": 1, "rejected": 0, "expired": 0, "unpaid": 0}
    assert finished["outcome"] == "error"


def test_resuming_a_failed_run_sends_the_failed_call_again_with_its_key(owner: Any) -> None:
    _apply(RETRY.replace(", retry: {max_attempts: 2, backoff_s: 0}", ""))
    session = _run(_start(owner, "retry", {}))
    assert session.state == "error" and RAN["flaky"] == 1

    session_resume(session=session, actor="operator")
    session = _run(session)

    assert session.state == "finished" and RAN["flaky"] == 2
    assert len(set(KEYS)) == 1


PARALLEL = """
slug: both
role: support
start: fan
nodes:
  fan:
    kind: parallel
    join: {join}
    branches:
      a: {{kind: tool, tool: lookup, args: {{number: "'SO-1'"}}}}
      b: {{kind: llm, prompt: "Say b"}}
    output: got
    next: end
rules:
  - {{when: {{user: "^Say b$"}}, answer: "b said"}}
"""


def test_parallel_all_waits_for_every_branch(owner: Any) -> None:
    _apply(PARALLEL.format(join="all"))
    session = _run(_start(owner, "both", {}))

    assert session.state == "finished"
    assert session.workflow_state["result"] == {
        "a": {"number": "SO-1", "total": 60.5, "customer_id": 7},
        "b": "b said",
    }


def test_parallel_any_takes_the_first_branch_and_cancels_the_others(owner: Any) -> None:
    _apply(PARALLEL.format(join="any"))
    session = _run(_start(owner, "both", {}))

    assert session.state == "finished"
    # The model branch answers in the step itself; the tool branch's call is never sent.
    assert session.workflow_state["result"] == {"b": "b said"}
    assert RAN["lookup"] == 0
    assert session.workflow_state["status"]["fan.a"] == "cancelled"


RACE = """
slug: race
role: support
start: fan
nodes:
  fan:
    kind: parallel
    join: any
    branches:
      work: {kind: tool, tool: TOOL, args: ARGS}
      timeout: {kind: wait, seconds: 1}
    output: got
    next: end
"""


def _race(tool: str, args: str) -> str:
    return RACE.replace("TOOL", tool).replace("ARGS", args)


def test_parallel_any_against_a_wait_takes_a_branch_that_finished_first_without_the_timer(
    owner: Any,
) -> None:
    _apply(_race("lookup", "{number: \"'SO-2'\"}"))
    session = _run(_start(owner, "race", {}))

    # The lookup finished in milliseconds: it wins at once; no timer holds the run.
    assert session.state == "finished", session.state
    assert session.workflow_state["result"] == {
        "work": {"number": "SO-2", "total": 20, "customer_id": 7}
    }
    assert session.workflow_state["status"]["fan.timeout"] == "cancelled"
    assert [c.tool_name for c in ToolCall.objects.filter(session=session)] == ["lookup"]


def test_parallel_any_against_a_wait_takes_the_timer_when_the_work_ran_past_it(
    owner: Any,
) -> None:
    _apply(_race("slow", "{seconds: 1.2}"))
    session = _run(_start(owner, "race", {}))

    assert session.state == "finished" and RAN["slow"] == 1
    assert session.workflow_state["result"] == {"timeout": None}
    assert session.workflow_state["status"]["fan.work"] == "cancelled"


def test_parallel_any_against_a_wait_waits_for_the_timer_when_the_work_failed(
    owner: Any,
) -> None:
    _apply(_race("refuse", "{n: 3}"))
    session = _run(_start(owner, "race", {}))

    # Nothing else can finish: the timer runs (durable, no worker held), then wins.
    assert session.state == "waiting_timer" and session.lease_owner is None
    assert session.timer_due_at <= timezone.now() + timedelta(seconds=1)
    Session.objects.filter(pk=session.pk).update(timer_due_at=timezone.now())
    timers_fire_due()
    session = _run(session)

    assert session.state == "finished"
    assert session.workflow_state["result"] == {"timeout": None}


JSON_OUT = """
slug: extract
role: support
start: pull
nodes:
  pull:
    kind: llm
    prompt: "Extract: {{ input.text }}"
    output_schema: {type: object, properties: {amount: {type: number}}, required: [amount]}
    output: data
    next: end
rules:
  - {when: {user: "not valid"}, answer: "{\\"amount\\": 42}"}
  - {when: {user: "^Extract: broken"}, answer: "amount is 42"}
  - {when: {user: "^Extract: "}, answer: "{\\"amount\\": 7}"}
"""


def test_an_llm_node_with_output_schema_returns_validated_json_after_one_repair(
    owner: Any,
) -> None:
    _apply(JSON_OUT)
    first = _run(_start(owner, "extract", {"text": "fine"}))
    repaired = _run(_start(owner, "extract", {"text": "broken"}))

    assert first.workflow_state["result"] == {"amount": 7}
    assert repaired.workflow_state["result"] == {"amount": 42}
    assert repaired.input_tokens > first.input_tokens  # two model calls, both recorded


CHOICE = """
slug: route
role: support
start: pick
nodes:
  pick:
    kind: choice
    prompt: "Route: {{ input.text }}"
    options: {billing: "about money", shipping: "about delivery"}
    default: shipping
    output: picked
  billing: {kind: llm, prompt: "Answer billing", output: answer, next: end}
  shipping: {kind: llm, prompt: "Answer shipping", output: answer, next: end}
rules:
  - {when: {user: "^Answer (\\\\w+)$"}, answer: "{{ match.1 }} team"}
  - {when: {user: "^Route: refund"}, answer: "billing"}
  - {answer: "no idea"}
"""


def test_a_choice_follows_the_models_pick_and_an_invalid_pick_takes_the_default(
    owner: Any,
) -> None:
    _apply(CHOICE)
    billing = _run(_start(owner, "route", {"text": "refund please"}))
    unsure = _run(_start(owner, "route", {"text": "hello"}))

    assert billing.workflow_state["values"]["picked"] == "billing"
    assert billing.workflow_state["result"] == "billing team"
    assert unsure.workflow_state["values"]["picked"] == "shipping"  # twice "no idea": default


WAIT = """
slug: later
role: support
start: pause
nodes:
  pause: {kind: wait, seconds: 30, next: look}
  look: {kind: tool, tool: lookup, args: {number: "'SO-2'"}, output: order, next: end}
"""


def test_a_wait_node_is_a_durable_timer(owner: Any) -> None:
    _apply(WAIT)
    session = _run(_start(owner, "later", {}))

    assert session.state == "waiting_timer" and session.lease_owner is None
    assert session.timer_due_at > timezone.now() + timedelta(seconds=25)
    assert RAN["lookup"] == 0
    Session.objects.filter(pk=session.pk).update(timer_due_at=timezone.now())
    timers_fire_due()
    session = _run(session)

    assert session.state == "finished" and RAN["lookup"] == 1


def test_a_run_past_its_deadline_fails(owner: Any) -> None:
    _apply(WAIT.replace("slug: later", "slug: later\ndeadline_s: 5"))
    session = _run(_start(owner, "later", {}))
    state = dict(session.workflow_state)
    state["deadline_at"] = 0
    Session.objects.filter(pk=session.pk).update(workflow_state=state, timer_due_at=timezone.now())
    timers_fire_due()
    session = _run(session)

    assert session.state == "error"
    assert session.workflow_state["error"]["message"] == "deadline"
    assert RAN["lookup"] == 0


def test_a_fork_from_a_nodes_checkpoint_runs_on_from_there(owner: Any) -> None:
    _apply(REFUND)
    session = _run(_start(owner, "refund", {"number": "SO-2"}))
    lookup_step = next(
        c.step
        for c in Checkpoint.objects.filter(session=session).order_by("step")
        if "workflow" in c.context and "lookup" in c.context["nodes"]
    )

    fork = _run(session_fork(session=session, step=lookup_step, actor="operator"))

    assert fork.state == "finished" and fork.workflow_version_id == session.workflow_version_id
    assert fork.workflow_state["result"] == "Customer told: refund on SO-2 done"
    assert RAN["lookup"] == 1  # the fork started after the lookup: its output was kept


def test_a_run_keeps_its_version_when_the_workflow_is_edited(owner: Any) -> None:
    _apply(REFUND)
    session = _start(owner, "refund", {"number": "SO-2"})
    report = _apply(REFUND.replace("refund on {{ input.number }} done", "all done"))

    assert report == "workflow refund: updated (version 2)"
    session = _run(session)
    assert session.workflow_state["result"] == "Customer told: refund on SO-2 done"
    again = _run(_start(owner, "refund", {"number": "SO-2"}))
    assert again.workflow_state["result"] == "Customer told: all done"
    assert _apply(REFUND.replace("refund on {{ input.number }} done", "all done")).endswith(
        "unchanged (version 2)"
    )


DELEGATE = """
slug: delegate
role: support
start: ask
nodes:
  ask: {kind: agent, agent: helper, task: "'look into ' + input.topic", output: found, next: end}
"""


def test_an_agent_node_runs_the_agents_loop_as_a_child_session(owner: Any) -> None:
    AgentFactory(slug="helper", rules=[{"answer": "Echo: {{ user }}"}])
    _apply(DELEGATE)
    session = _run(_start(owner, "delegate", {"topic": "SO-9"}), stopped="waiting")

    # The parent waits without a worker; its child runs for the same owner and role.
    assert session.state == "tool_wait" and session.lease_owner is None
    child = Session.objects.get(parent=session)
    assert (child.owner_id, child.role, child.agent.slug) == (owner.pk, "support", "helper")
    assert child.parent_call.call_id == "ask#1"
    # A stray run of the parent (a redelivered task) starts no second child.
    assert _run(session, stopped="waiting").state == "tool_wait"
    assert Session.objects.filter(parent=session).count() == 1

    assert _run(child).state == "finished"
    session = _run(session)

    assert session.state == "finished"
    assert session.workflow_state["result"] == "Echo: look into SO-9"


def test_a_child_that_fails_fails_the_agent_node_with_a_clear_error(owner: Any) -> None:
    AgentFactory(slug="helper")
    _apply(DELEGATE)
    session = _run(_start(owner, "delegate", {"topic": "x"}), stopped="waiting")
    child = Session.objects.get(parent=session)
    Session.objects.filter(pk=child.pk).update(state="error", turn=1, last_error="boom")

    session = _run(session)

    assert session.state == "error"
    assert "ended error: boom" in session.workflow_state["error"]["message"]


def test_cancelling_the_parent_cancels_its_children(owner: Any) -> None:
    AgentFactory(slug="helper")
    _apply(DELEGATE)
    session = _run(_start(owner, "delegate", {"topic": "x"}), stopped="waiting")
    child = Session.objects.get(parent=session)

    session_cancel(session=session, actor="op")

    assert Session.objects.get(pk=child.pk).cancel_requested
    assert _run(child).state == "cancelled"
    assert _run(session).state == "cancelled"


def test_agents_nest_no_deeper_than_the_agents_max_depth(owner: Any) -> None:
    AgentFactory(slug="helper")
    _apply(DELEGATE)
    Agent.objects.filter(slug="workflow-delegate").update(max_depth=0)
    session = _run(_start(owner, "delegate", {"topic": "x"}))

    assert session.state == "error" and not Session.objects.filter(parent=session).exists()
    assert "max_depth" in session.workflow_state["error"]["message"]


@tool_handler("tests.node.sluggish")
def _sluggish(n: int) -> dict[str, Any]:
    time.sleep(1.0)
    return {"n": n}


def test_a_tool_nodes_timeout_s_limits_its_call(owner: Any) -> None:
    ToolFactory(
        name="sluggish",
        handler="tests.node.sluggish",
        timeout_s=30,
        parameters={"type": "object", "properties": {"n": {"type": "integer"}}},
    )
    _apply(
        "slug: quick\nrole: support\nstart: call\nnodes:\n"
        "  call: {kind: tool, tool: sluggish, args: {n: 1}, timeout_s: 0.2, output: got, next: end}\n"
    )
    started = time.monotonic()
    session = _run(_start(owner, "quick", {}))

    assert session.state == "error"
    assert "did not answer within 0.2 s" in session.workflow_state["error"]["message"]
    assert time.monotonic() - started < 3  # 0.2 s twice (a read-only call is tried again), not 30


def test_a_run_cannot_be_taken_over_like_a_conversation(owner: Any) -> None:
    _apply(REFUND)
    session = _run(_start(owner, "refund", {"number": "SO-2"}))

    for takeover in (
        lambda: session_operator_reply(session=session, content="hi", actor="op"),
        lambda: session_hand_back(session=session, actor="op"),
        lambda: session_force_finish(session=session, content="done", actor="op"),
    ):
        with pytest.raises(Conflict) as info:
            takeover()
        assert info.value.code == "not_a_conversation"


def test_a_choice_is_constrained_by_structured_output_where_the_wire_has_it(
    owner: Any, openai_server: FakeModelServer, fake_endpoint: ModelEndpoint
) -> None:
    _apply(CHOICE.replace("slug: route", f"slug: route\nmodel: {fake_endpoint.name}"))
    openai_server.script(
        Reply(text='{"option": "billing"}'), Reply(text="billing team, via the real wire")
    )
    session = _run(_start(owner, "route", {"text": "hello"}))

    assert session.workflow_state["values"]["picked"] == "billing"
    sent = openai_server.requests[0].body["response_format"]
    assert sent["type"] == "json_schema"
    assert sent["json_schema"]["schema"]["properties"]["option"]["enum"] == ["billing", "shipping"]


NESTED = """
slug: nested
role: support
input: {type: object, properties: {items: {type: array}}}
start: check
nodes:
  check:
    kind: condition
    cases: [{when: "input.items.map(x, input.items.map(y, x + y)).size() > 0", next: end}]
    default: end
"""


def test_a_when_too_costly_for_its_input_fails_the_node_with_expression_limit_at_once(
    owner: Any,
) -> None:
    _apply(NESTED)
    small = _run(_start(owner, "nested", {"items": [1, 2, 3]}))
    assert small.state == "finished"

    # Unbounded, cel took ~0.8 s over these 100 items (and 27 s a level deeper), holding the
    # GIL; the error's cost figure shows it was refused before it ran (no wall-clock bound
    # here: a loaded CI machine is no measure, the bench is).
    session = _run(_start(owner, "nested", {"items": list(range(100))}))
    assert session.state == "error"
    failed = [d for t, d in _events(session) if t == "node.failed"]
    assert failed[0]["node"] == "check"
    assert failed[0]["error"].startswith(
        "expression_limit: workflow 'nested', node 'check', field 'cases[0].when': "
    )
    assert "more than EXPRESSION_COST_LIMIT (60,000)" in failed[0]["error"]


def test_a_map_over_more_items_than_the_setting_fails_with_expression_limit(
    owner: Any, settings: Any
) -> None:
    settings.WORKFLOW_MAP_MAX_ITEMS = 4
    _apply(FAN)
    session = _run(_start(owner, "fan", {"customers": [5, 6, 7, 8, 9]}))

    assert session.state == "error"
    failed = [d for t, d in _events(session) if t == "node.failed"]
    assert failed[0]["error"] == (
        "expression_limit: workflow 'fan', node 'each', field 'over': it gave 5 items; "
        "a map takes at most 4 (WORKFLOW_MAP_MAX_ITEMS)"
    )
    assert RAN["notify"] == 0


EDITED = """
slug: edited
role: support
input: {type: object, properties: {number: {type: string}}, required: [number]}
start: lookup
nodes:
  lookup: {kind: tool, tool: lookup, args: {number: input.number}, output: order, next: review}
  review:
    kind: human
    title: Refund check
    summary: "Refund {{ order.total }} on {{ input.number }}"
    show: {amount: "order.total", customer: "order.customer_id"}
    editable: [order]
    output: decision
    next: notify
  notify: {kind: tool, tool: notify, args: {customer: order.customer_id}, output: sent, next: end}
"""


def test_a_review_card_says_what_is_decided_and_derives_its_risk_from_what_it_guards(
    owner: Any,
) -> None:
    _apply(REFUND)  # review -> notify, a tool with side effects; no risk_level declared
    session = _run(_start(owner, "refund", {"number": "SO-1"}))
    approval = Approval.objects.get(session=session)
    assert approval.risk_level == 2
    assert approval.review == {
        "workflow": "refund",
        "run": str(session.pk),
        "node": "review",
        "title": "review",
        "summary": "Refund 60.5 on SO-1",
        "show": {},
        "editable": {},
    }

    _apply(EDITED.replace("editable: [order]", "risk_level: 3"))
    session = _run(_start(owner, "edited", {"number": "SO-1"}))
    approval = Approval.objects.get(session=session)
    assert approval.risk_level == 3  # as declared
    assert approval.review is not None
    assert approval.review["title"] == "Refund check"
    assert approval.review["show"] == {"amount": 60.5, "customer": 7}


def test_a_review_without_editable_values_refuses_an_edit_and_the_card_offers_none(
    owner: Any,
) -> None:
    from approvals.admin import QueueCard
    from record.errors import InvalidInput

    _apply(REFUND)
    approver = UserFactory(username="wf-approver")
    approver_grant(username=approver.username, groups=["approvers"])
    session = _run(_start(owner, "refund", {"number": "SO-1"}))
    approval = Approval.objects.get(session=session)
    assert QueueCard(approval=approval, recent=[]).can_edit is False
    with pytest.raises(InvalidInput) as refused:
        approval_decide(
            approval_id=approval.pk,
            approve=True,
            user=approver,
            groups=["approvers"],
            arguments={"summary": "Refund 1 on SO-1"},
        )
    assert refused.value.code == "not_editable"
    assert Approval.objects.get(pk=approval.pk).status == "pending"


def test_an_approvers_edit_of_an_editable_value_reaches_the_next_node(owner: Any) -> None:
    from approvals.admin import QueueCard
    from record.errors import InvalidInput

    _apply(EDITED)
    approver = UserFactory(username="wf-approver")
    approver_grant(username=approver.username, groups=["approvers"])
    session = _run(_start(owner, "edited", {"number": "SO-1"}))
    approval = Approval.objects.get(session=session)
    assert QueueCard(approval=approval, recent=[]).can_edit is True
    order = approval.review["editable"]["order"] if approval.review else None
    assert order == {"number": "SO-1", "total": 60.5, "customer_id": 7}
    with pytest.raises(InvalidInput):  # only the names the node declares
        approval_decide(
            approval_id=approval.pk,
            approve=True,
            user=approver,
            groups=["approvers"],
            arguments={"summary": "changed"},
        )

    approval_decide(
        approval_id=approval.pk,
        approve=True,
        user=approver,
        groups=["approvers"],
        arguments={"order": {**order, "customer_id": 9}},
    )
    session = _run(session)

    assert session.state == "finished", list(ToolCall.objects.values_list("tool_name", "error"))
    assert session.workflow_state["values"]["sent"] == {"sent_to": 9}
