"""Business-rule revalidation on the real engine: a resumed or forked run first runs the
tools' prechecks (here over HTTP, against an orders API on 127.0.0.1) on their last calls,
and the model is told what no longer holds instead of acting on a stale picture."""

import json
import threading
import uuid
from collections.abc import Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.db.models import F
from django.utils import timezone

from approvals.models import Approval
from engine import session_run
from engine.moves.turn import turn_fail
from engine.phases.model import model_step
from engine.phases.tools import tool_step
from engine.runner.lease import lease_acquire
from record.models import Checkpoint, Message, ModelEndpoint, Session, ToolCall
from sessions.services import (
    approval_decide,
    message_post,
    review_answer,
    session_fork,
    session_resume,
    sessions_sweep,
)
from tests.factories import AgentFactory, SessionFactory, ToolFactory, UserFactory
from tests.fakes.fixtures import fake_servers, openai_server, unique  # noqa: F401
from tests.fakes.model_servers import Call, FakeModelServer, Reply
from tools.models import Tool
from tools.registry import tool_handler

pytestmark = pytest.mark.django_db(transaction=True)

KEY_ENV = "REVALIDATION_MODEL_KEY"


class OrdersApi:
    """A business API: POST /pay pays an order; POST /pay/precheck says whether the
    order still exists and is unpaid. Every request is recorded."""

    def __init__(self) -> None:
        self.orders: dict[str, str] = {}
        self.seen: list[tuple[str, Any]] = []
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

            def do_GET(self) -> None:  # noqa: N802 - stdlib naming
                # The payment status by idempotency key: no payment under any key here.
                api.seen.append((self.path, None))
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_POST(self) -> None:  # noqa: N802 - stdlib naming
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                api.seen.append((self.path, body))
                if self.path == "/pay/precheck":
                    order = body["arguments"].get("order_id")
                    status = api.orders.get(order)
                    if status is None:
                        answer = {"ok": False, "reason": f"order {order} no longer exists"}
                    elif status != "unpaid":
                        answer = {"ok": False, "reason": f"order {order} is already {status}"}
                    else:
                        answer = {"ok": True}
                    code = 200
                elif self.path == "/pay":
                    order = body.get("order_id")
                    if api.orders.get(order) == "unpaid":
                        api.orders[order] = "paid"
                        answer, code = {"ok": True, "paid": order}, 200
                    else:
                        answer, code = {"error": "payment service unavailable"}, 503
                else:
                    answer, code = {"error": "not found"}, 404
                data = json.dumps(answer).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}{path}"

    def prechecks(self) -> list[Any]:
        return [body for path, body in self.seen if path == "/pay/precheck"]

    def payments(self) -> list[Any]:
        return [body for path, body in self.seen if path == "/pay"]


@pytest.fixture
def orders() -> Iterator[OrdersApi]:
    api = OrdersApi()
    thread = threading.Thread(target=api.server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.daemon = True
    thread.start()
    try:
        yield api
    finally:
        api.server.shutdown()
        api.server.server_close()


@pytest.fixture
def endpoint(openai_server: FakeModelServer, unique: str, monkeypatch) -> ModelEndpoint:  # noqa: F811
    monkeypatch.setenv(KEY_ENV, "sk-revalidation-0123456789")
    return ModelEndpoint.objects.create(
        name=f"fake-openai-{unique}", api="openai", base_url=openai_server.base_url,
        model="fake-model-1", api_key_env=KEY_ENV, first_token_timeout_s=5, total_timeout_s=10,
    )  # fmt: skip


def _pay_tool(orders: OrdersApi, *, precheck: bool = True) -> Tool:
    tool: Tool = ToolFactory.create(
        name=f"pay_order_{uuid.uuid4().hex[:6]}",
        kind="http",
        url=orders.url("/pay"),
        precheck_url=orders.url("/pay/precheck") if precheck else "",
        side_effects=True,
        idempotent=True,
        parameters={
            "type": "object",
            "properties": {"order_id": {"type": "string"}},
            "required": ["order_id"],
        },
    )
    return tool


def _session(tool: Tool, endpoint: ModelEndpoint) -> Session:
    agent = AgentFactory.create(
        slug=f"orders-{uuid.uuid4().hex[:8]}", model=endpoint, tools=[tool.name], rules=[]
    )
    return SessionFactory.create(agent=agent, owner=UserFactory(username="orders-owner"))


def _system_notes(server: FakeModelServer) -> list[str]:
    return [m["content"] for m in server.requests[-1].messages if m["role"] == "system"]


def _run(session: Session) -> Session:
    assert session_run(session_id=session.pk).stopped == "idle"
    return Session.objects.get(pk=session.pk)


def test_a_resumed_run_is_told_the_order_was_paid_meanwhile(
    orders: OrdersApi,
    openai_server: FakeModelServer,  # noqa: F811
    endpoint: ModelEndpoint,
):
    """The payment failed, the run stopped in error; meanwhile the customer paid by
    another channel. On resume the precheck of the last pay call finds the order paid,
    and the model is told so before it decides (and does not pay again)."""
    orders.orders["A-2"] = "locked"  # the payment service refuses it for now
    tool = _pay_tool(orders)
    session = _session(tool, endpoint)
    openai_server.script(Reply(calls=[Call(tool.name, {"order_id": "A-2"}, id="call_pay")]))
    message_post(session=session, content="pay order A-2")
    owner = "worker:test"
    assert lease_acquire(session_id=session.pk, owner=owner, seconds=30)
    model_step(Session.objects.get(pk=session.pk), owner)
    tool_step(Session.objects.get(pk=session.pk), owner)
    row = Session.objects.get(pk=session.pk)
    assert row.state == "processing"  # the results went back to the model
    turn_fail(row, owner, "stopped by an operator after the payment error")
    Session.objects.filter(pk=session.pk).update(lease_owner=None, lease_expires_at=None)
    assert orders.prechecks() == []  # a run that is not resumed checks nothing

    orders.orders["A-2"] = "paid"  # by another channel, while the run was stopped
    openai_server.script(Reply(text="Order A-2 has already been paid; nothing more to do."))
    session_resume(session=Session.objects.get(pk=session.pk), actor="operator")
    session = _run(session)

    assert session.state == "finished", (session.state, session.last_error)
    assert orders.prechecks() == [{"tool": tool.name, "arguments": {"order_id": "A-2"}}]
    notes = [n for n in _system_notes(openai_server) if "checked again" in n]
    assert len(notes) == 1, _system_notes(openai_server)
    assert f'{tool.name}({{"order_id": "A-2"}}): order A-2 is already paid' in notes[0]
    assert "Do not repeat" in notes[0]
    assert len(orders.payments()) == 1  # the failed attempt only
    # The note is part of the history, for every later call of the run.
    stored = Message.objects.filter(session=session, role="system", content=notes[0])
    assert stored.count() == 1
    assert not Session.objects.get(pk=session.pk).resume_check


def test_a_fork_is_told_the_order_is_gone_and_a_holding_precheck_adds_nothing(
    orders: OrdersApi,
    openai_server: FakeModelServer,  # noqa: F811
    endpoint: ModelEndpoint,
):
    orders.orders.update({"A-1": "unpaid", "B-1": "unpaid"})
    tool = _pay_tool(orders)
    session = _session(tool, endpoint)
    openai_server.script(
        Reply(calls=[Call(tool.name, {"order_id": "A-1"}, id="call_1")]),
        Reply(text="Paid A-1."),
    )
    message_post(session=session, content="pay A-1")
    session = _run(session)
    assert session.state == "finished" and orders.orders["A-1"] == "paid"
    assert orders.prechecks() == []
    before_answer = Checkpoint.objects.get(session=session, context__phase="tool_results")

    # A fork at the point before the model answered: the order was since deleted.
    del orders.orders["A-1"]
    openai_server.script(Reply(text="Order A-1 no longer exists."))
    fork = _run(session_fork(session=session, step=before_answer.step, actor="api:owner"))
    assert fork.state == "finished"
    notes = [n for n in _system_notes(openai_server) if "checked again" in n]
    assert len(notes) == 1 and "order A-1 no longer exists" in notes[0], notes
    assert len(orders.payments()) == 1

    # Unreachable check: the model hears the precondition could not be confirmed.
    Tool.objects.filter(pk=tool.pk).update(precheck_url="http://127.0.0.1:9/precheck")
    openai_server.script(Reply(text="I could not confirm the order."))
    fork = _run(session_fork(session=session, step=before_answer.step, actor="api:owner"))
    notes = [n for n in _system_notes(openai_server) if "checked again" in n]
    assert len(notes) == 1 and "could not be confirmed (the check failed" in notes[0], notes

    # A check that holds: no note at all.
    Tool.objects.filter(pk=tool.pk).update(precheck_url=orders.url("/pay/precheck"))
    orders.orders["A-1"] = "unpaid"
    openai_server.script(Reply(text="Ok."))
    fork = _run(session_fork(session=session, step=before_answer.step, actor="api:owner"))
    assert not [n for n in _system_notes(openai_server) if "checked again" in n]
    assert orders.prechecks()[-1] == {"tool": tool.name, "arguments": {"order_id": "A-1"}}


# After a crash recovery, before an uncertain call is sent again, after a long pause -------

CRASHED = "crashed-worker:1:1:dead"


@pytest.fixture
def no_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """The test drives the run: no broker message may wake a worker of a live stack."""
    monkeypatch.setattr("record.dispatch.run_enqueue_on_commit", lambda *args: None)
    monkeypatch.setattr("record.dispatch.run_enqueue", lambda *args: None)


def _decided_then_crashed(session: Session, content: str) -> Session:
    """The model decided (intents committed, tool_wait); its worker then died: the lease
    lapsed with its owner still named."""
    message_post(session=session, content=content)
    assert lease_acquire(session_id=session.pk, owner=CRASHED, seconds=30)
    model_step(Session.objects.get(pk=session.pk), CRASHED)
    Session.objects.filter(pk=session.pk).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    row = Session.objects.get(pk=session.pk)
    assert (row.state, row.lease_owner, row.resume_check) == ("tool_wait", CRASHED, False)
    return row


@pytest.mark.parametrize("by", ["sweeper", "takeover"])
def test_after_a_crash_a_failed_precheck_sends_the_call_to_a_person_not_to_the_api(
    orders: OrdersApi,
    openai_server: FakeModelServer,  # noqa: F811
    endpoint: ModelEndpoint,
    no_worker: None,
    by: str,
):
    """The worker died after the model decided to pay A-3; meanwhile the customer paid by
    another channel. The recovered run checks the precondition before sending: the call
    goes to the approvals queue saying what failed, and the order is not paid twice. The
    reviewer's "not_taken" is what the model then reads."""
    orders.orders["A-3"] = "unpaid"
    tool = _pay_tool(orders)
    session = _session(tool, endpoint)
    openai_server.script(Reply(calls=[Call(tool.name, {"order_id": "A-3"}, id="call_pay")]))
    _decided_then_crashed(session, "pay order A-3")
    orders.orders["A-3"] = "paid"
    if by == "sweeper":
        assert str(session.pk) in sessions_sweep()
        assert Session.objects.get(pk=session.pk).resume_check

    assert session_run(session_id=session.pk).stopped == "idle"

    row = Session.objects.get(pk=session.pk)
    assert row.state == "awaiting_approval"
    assert orders.payments() == []
    assert orders.prechecks() == [{"tool": tool.name, "arguments": {"order_id": "A-3"}}]
    review = Approval.objects.get(session=session)
    assert (review.kind, review.status) == ("recovery_review", "pending")
    assert "after the run was interrupted and recovered" in review.reason
    assert "no longer holds: order A-3 is already paid" in review.reason

    reviewer = UserFactory(username="bob")
    review_answer(approval_id=review.pk, answer="not_taken", user=reviewer, groups=["approvers"])
    openai_server.script(Reply(text="Order A-3 was already paid; I did not pay it again."))
    assert session_run(session_id=session.pk).stopped == "idle"

    row = Session.objects.get(pk=session.pk)
    assert row.state == "finished" and not row.resume_check
    assert orders.payments() == []
    told = [m["content"] for m in openai_server.requests[-1].messages if m["role"] == "tool"]
    assert told and "bob decided not to send this call" in told[-1], told
    assert "order A-3 is already paid" in told[-1] and "send_again" not in told[-1]
    # The check is spent: the model step that follows does not check the call again.
    assert len(orders.prechecks()) == 1


def test_an_uncertain_call_is_checked_before_it_is_sent_again(
    orders: OrdersApi,
    openai_server: FakeModelServer,  # noqa: F811
    endpoint: ModelEndpoint,
    no_worker: None,
):
    """Sent before the crash, the probe says it did not take effect; before sending it
    again its precondition is checked: the order was deleted meanwhile, so a person
    decides, told the key, the probe's answer and what failed."""
    orders.orders["A-4"] = "unpaid"
    tool = _pay_tool(orders)
    Tool.objects.filter(pk=tool.pk).update(status_url=orders.url("/pay/status"))
    session = _session(tool, endpoint)
    openai_server.script(Reply(calls=[Call(tool.name, {"order_id": "A-4"}, id="call_pay")]))
    _decided_then_crashed(session, "pay order A-4")
    call = ToolCall.objects.get(session=session)
    ToolCall.objects.filter(pk=call.pk).update(dispatched_at=timezone.now())
    del orders.orders["A-4"]

    assert session_run(session_id=session.pk).stopped == "idle"

    assert orders.payments() == []
    review = Approval.objects.get(session=session)
    assert review.kind == "recovery_review" and call.idempotency_key in review.reason
    assert "before sending it again (its probe said: not_done)" in review.reason
    assert "no longer holds: order A-4 no longer exists" in review.reason


def test_after_a_long_pause_the_precondition_of_a_waiting_call_is_checked_again(
    orders: OrdersApi,
    openai_server: FakeModelServer,  # noqa: F811
    endpoint: ModelEndpoint,
    no_worker: None,
    settings,
):
    """No crash: the call waited for an approver past ENV_CHECK_PAUSE_S. Approved, it is
    not sent on the old picture: the order was paid meanwhile, so a person is asked."""
    orders.orders["A-5"] = "unpaid"
    tool = _pay_tool(orders)
    Tool.objects.filter(pk=tool.pk).update(requires_approval=True)
    session = _session(tool, endpoint)
    openai_server.script(Reply(calls=[Call(tool.name, {"order_id": "A-5"}, id="call_pay")]))
    message_post(session=session, content="pay order A-5")
    assert session_run(session_id=session.pk).stopped == "idle"
    assert Session.objects.get(pk=session.pk).state == "awaiting_approval"
    approval = Approval.objects.get(session=session)
    approver = UserFactory(username="carol")
    approval_decide(approval_id=approval.pk, approve=True, user=approver, groups=["approvers"])
    orders.orders["A-5"] = "paid"
    ToolCall.objects.filter(session=session).update(
        created_at=timezone.now() - timedelta(seconds=settings.ENV_CHECK_PAUSE_S + 60)
    )

    assert session_run(session_id=session.pk).stopped == "idle"

    assert orders.payments() == []
    assert not Session.objects.get(pk=session.pk).resume_check  # no crash: the pause did it
    review = Approval.objects.get(session=session, kind="recovery_review")
    assert "after a pause of 11 min since it was decided" in review.reason
    assert "order A-5 is already paid" in review.reason


def test_a_fresh_call_is_sent_without_a_check(
    orders: OrdersApi,
    openai_server: FakeModelServer,  # noqa: F811
    endpoint: ModelEndpoint,
    no_worker: None,
):
    orders.orders["A-6"] = "unpaid"
    tool = _pay_tool(orders)
    session = _session(tool, endpoint)
    openai_server.script(
        Reply(calls=[Call(tool.name, {"order_id": "A-6"}, id="call_pay")]), Reply(text="Paid.")
    )
    message_post(session=session, content="pay order A-6")
    assert _run(session).state == "finished"
    assert orders.prechecks() == [] and len(orders.payments()) == 1


def test_after_a_crash_a_read_only_call_whose_precheck_fails_is_not_run_and_the_model_told(
    orders: OrdersApi,
    openai_server: FakeModelServer,  # noqa: F811
    endpoint: ModelEndpoint,
    no_worker: None,
):
    """A read-only call has no effect to protect: no person is asked, the model reads what
    no longer holds instead of a result read on a stale premise."""
    orders.orders["A-8"] = "unpaid"
    tool = _pay_tool(orders)
    Tool.objects.filter(pk=tool.pk).update(side_effects=False)
    session = _session(tool, endpoint)
    openai_server.script(Reply(calls=[Call(tool.name, {"order_id": "A-8"}, id="call_look")]))
    _decided_then_crashed(session, "look at order A-8")
    del orders.orders["A-8"]
    openai_server.script(Reply(text="Order A-8 no longer exists."))

    assert session_run(session_id=session.pk).stopped == "idle"

    assert Session.objects.get(pk=session.pk).state == "finished"
    assert orders.payments() == [] and not Approval.objects.filter(session=session).exists()
    call = ToolCall.objects.get(session=session)
    assert call.status == "rejected"
    told = [m["content"] for m in openai_server.requests[-1].messages if m["role"] == "tool"]
    assert "this call was not run" in told[-1] and "order A-8 no longer exists" in told[-1]


NOTIFIED: list[str] = []


@tool_handler("tests.revalidation.notify")
def _notify(order_id: str) -> dict[str, Any]:
    NOTIFIED.append(order_id)
    return {"ok": True}


def test_a_call_held_for_drift_stays_held_while_a_person_reviews_its_sibling(
    orders: OrdersApi,
    openai_server: FakeModelServer,  # noqa: F811
    endpoint: ModelEndpoint,
    no_worker: None,
):
    """Pay and notify were decided; the worker died having sent the payment (uncertain);
    meanwhile the agent was changed and the order paid. The payment goes to a person, the
    notice is held for the drift; after the person's answer the notice is still not sent:
    the model re-plans first."""
    NOTIFIED.clear()
    orders.orders["A-9"] = "unpaid"
    pay = _pay_tool(orders)
    Tool.objects.filter(pk=pay.pk).update(status_url=orders.url("/pay/status"))
    notify: Tool = ToolFactory.create(
        name=f"notify_{uuid.uuid4().hex[:6]}",
        kind="python",
        handler="tests.revalidation.notify",
        side_effects=True,
        parameters={
            "type": "object",
            "properties": {"order_id": {"type": "string"}},
            "required": ["order_id"],
        },
    )
    agent = AgentFactory.create(
        slug=f"orders-{uuid.uuid4().hex[:8]}", model=endpoint, tools=[pay.name, notify.name]
    )
    session = SessionFactory.create(agent=agent, owner=UserFactory(username="orders-owner"))
    openai_server.script(
        Reply(
            calls=[
                Call(pay.name, {"order_id": "A-9"}, id="call_pay"),
                Call(notify.name, {"order_id": "A-9"}, id="call_notify"),
            ]
        )
    )
    _decided_then_crashed(session, "pay A-9 and tell the customer")
    ToolCall.objects.filter(session=session, tool_name=pay.name).update(
        dispatched_at=timezone.now()
    )
    orders.orders["A-9"] = "paid"
    agent.system_prompt = "Never notify customers directly."
    agent.save()

    assert session_run(session_id=session.pk).stopped == "idle"
    review = Approval.objects.get(session=session)
    assert review.tool_name == pay.name
    assert "Did this call take effect?" in review.reason
    review_answer(
        approval_id=review.pk,
        answer="not_taken",
        user=UserFactory(username="dave"),
        groups=["approvers"],
    )
    openai_server.script(Reply(text="A-9 was already paid; I did not notify the customer."))
    assert session_run(session_id=session.pk).stopped == "idle"

    assert NOTIFIED == [] and orders.payments() == []
    held = ToolCall.objects.get(session=session, tool_name=notify.name)
    assert held.status == "rejected" and "this call was not sent" in (held.error or "")
    assert Session.objects.get(pk=session.pk).state == "finished"


def test_after_a_long_pause_the_model_is_told_what_no_longer_holds(
    orders: OrdersApi,
    openai_server: FakeModelServer,  # noqa: F811
    endpoint: ModelEndpoint,
    no_worker: None,
    settings,
):
    """The user comes back hours later: the last payment's premise is checked before the
    model decides again (the order was refunded meanwhile)."""
    orders.orders["A-10"] = "unpaid"
    tool = _pay_tool(orders)
    session = _session(tool, endpoint)
    openai_server.script(
        Reply(calls=[Call(tool.name, {"order_id": "A-10"}, id="call_pay")]), Reply(text="Paid.")
    )
    message_post(session=session, content="pay A-10")
    assert _run(session).state == "finished"
    assert orders.prechecks() == []

    orders.orders["A-10"] = "refunded"
    back = timedelta(seconds=settings.ENV_CHECK_PAUSE_S + 60)
    Message.objects.filter(session=session).update(created_at=F("created_at") - back)
    openai_server.script(Reply(text="A-10 was refunded meanwhile."))
    message_post(session=session, content="is A-10 all right?")
    assert _run(session).state == "finished"

    notes = [n for n in _system_notes(openai_server) if "checked again" in n]
    assert len(notes) == 1 and "order A-10 is already refunded" in notes[0], notes
