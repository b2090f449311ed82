"""A paid tool and a worker killed for real (SIGKILL) around its call: after the points were
reserved and before the request went out, and while the request is at the tool's API. A
second worker finishes each turn; the tool's effect happens once (idempotent by the
call's key, resent with the same key when uncertain), the owner is charged once, nothing
stays reserved, and the ledger explains the balance."""

import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.db.models import Sum

from billing.models import CreditAccount, CreditLedger, CreditReservation
from billing.services import credits_grant
from record.models import ToolCall
from tests.e2e.support import api, create_session, post_message, stack_logs, wait_events
from tests.factories import AgentFactory, ModelEndpointFactory, ToolFactory, api_key_for
from tests.stack import Stack, running_stack

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

POINTS = 10
GRANT = 100
HOLD_S = 20.0  # the longest the API holds a held answer (it is let go once the worker died)


class PaidApi:
    """A charge API on 127.0.0.1: one effect per Idempotency-Key; `hold()` makes the next
    request wait for `release()` before it answers."""

    def __init__(self) -> None:
        self.effects: set[str] = set()
        self.requests: list[str] = []
        self._hold_next = False
        self._released = threading.Event()
        self._lock = threading.Lock()
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the http.server hook
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                key = self.headers.get("Idempotency-Key") or ""
                with api._lock:
                    api.requests.append(key)
                    api.effects.add(key)  # the effect happens on arrival, as a real charge does
                    held, api._hold_next = api._hold_next, False
                if held:
                    api._released.wait(HOLD_S)
                body = json.dumps({"charged": True}).encode()
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:
                    pass  # the caller was killed meanwhile

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/charge"

    def hold(self) -> None:
        self._released.clear()
        self._hold_next = True

    def release(self) -> None:
        self._released.set()

    def close(self) -> None:
        self.release()
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def paid_api() -> Iterator[PaidApi]:
    server = PaidApi()
    yield server
    server.close()


def _until(check: Callable[[], bool], timeout: float, describe: Callable[[], str]) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(describe())
        time.sleep(0.05)


def _finish_turn(stack: Stack, client, session_id: str, worker: str, logs) -> list[dict]:  # type: ignore[no-untyped-def]
    stack.start_worker(worker)
    return wait_events(
        client,
        session_id,
        lambda events: any(e["type"] == "turn.finished" for e in events),
        40,
        logs,
    )


def _assert_charged_once(session_id: str, api_calls: int, server: PaidApi) -> None:
    call = ToolCall.objects.get(session_id=session_id)
    assert call.status == "success", (call.status, call.error)
    key = call.idempotency_key
    assert server.effects >= {key} and server.requests.count(key) == api_calls
    ledger = CreditLedger.objects.filter(idempotency_key=key)
    assert sorted(ledger.values_list("kind", flat=True)) == ["reserve", "settle"]
    reservation = CreditReservation.objects.get(idempotency_key=key)
    assert (reservation.status, reservation.points) == ("settled", POINTS)


def test_a_worker_killed_around_a_paid_call_never_charges_twice(tmp_path: Path, paid_api: PaidApi):
    ToolFactory(
        name="charge_card", kind="http", url=paid_api.url, method="POST", timeout_s=30,
        side_effects=True, idempotent=True, credit_cost=POINTS, roles=[],
        parameters={"type": "object", "properties": {"amount": {"type": "integer"}}},
    )  # fmt: skip
    AgentFactory(
        slug="paid-crash",
        model=ModelEndpointFactory(name="rules-paid-crash", api="rules", options={}),
        tools=["charge_card"],
        rules=[
            {"when": {"last_tool": None}, "tool_calls": [{"tool": "charge_card", "args": {"amount": 5}}]},
            {"answer": "charged: {{ result.charged }}"},
        ],
    )  # fmt: skip
    key = api_key_for("alice")
    owner = get_user_model().objects.get(username="alice")
    credits_grant(owner_id=owner.pk, points=GRANT, actor="test")
    # A stack and queue of its own; the first worker kills itself once, right after it
    # reserved the points (FAULT_MARKER_DIR makes the point fire once); a short lease
    # makes the takeovers quick.
    extra = {
        "SESSION_LEASE_S": "3",
        "CELERY_QUEUE": f"agentplatform-credit-crash-{os.getpid()}",
        "FAULT_POINTS": "after_credits_reserved",
        "FAULT_MARKER_DIR": str(tmp_path),
    }
    with running_stack(extra_env=extra) as stack, api(stack, key) as client:
        logs = stack_logs(stack, "worker", "worker2", "worker3", "beat")

        # (a) Killed after the reservation, before the request went out.
        first = create_session(client, "paid-crash")
        post_message(client, first, "charge me")
        victim = stack.procs["worker"]
        _until(lambda: victim.poll() is not None, 30, logs)
        assert victim.poll() == -9, victim.poll()
        assert (tmp_path / "fault-after_credits_reserved.fired").exists()
        assert paid_api.requests == []  # nothing was sent
        held = CreditAccount.objects.get(owner=owner)
        assert (held.balance, held.reserved) == (GRANT - POINTS, POINTS)
        events = _finish_turn(stack, client, first, "worker2", logs)
        assert events[-1]["data"]["stop_reason"] == "answer", events[-1]
        _assert_charged_once(first, 1, paid_api)

        # (b) Killed while the request is at the API (its answer held until the kill).
        paid_api.hold()
        second = create_session(client, "paid-crash")
        post_message(client, second, "charge me again")
        _until(lambda: len(paid_api.requests) == 2, 30, logs)
        stack.stop("worker2", 9)
        paid_api.release()
        events = _finish_turn(stack, client, second, "worker3", logs)
        assert events[-1]["data"]["stop_reason"] == "answer", events[-1]
        # Uncertain after the crash and idempotent: sent again with the same key, one effect.
        _assert_charged_once(second, 2, paid_api)

    assert len(paid_api.effects) == 2  # one per logical call
    account = CreditAccount.objects.get(owner=owner)
    assert (account.balance, account.reserved) == (GRANT - 2 * POINTS, 0)
    ledger = CreditLedger.objects.filter(account=account).aggregate(s=Sum("delta"))["s"]
    assert ledger == account.balance
